"""An address served by one ``timestone broker --workers`` command only: its claim, and a probe that nobody
else listens there.

The members of ``--workers`` bind their shared listeners with ``SO_REUSEPORT``, and Linux lets any other
socket of the same user that sets it too join such an address: a second ``--workers`` command on the same
port (another configuration, another systemd instance) would start without an error, and the kernel would
spread devices over two brokers that know nothing of each other. Before it starts anything, the command
therefore:

- **claims** each listener's ``host:port``: it binds a Unix socket in Linux's abstract namespace named after
  it (``@timestone-broker-workers/<host>:<port>``). Binding a name is atomic, only one socket can hold it,
  and the kernel frees it when the last descriptor of that socket closes, so a crash or SIGKILL leaves no
  stale claim behind (no file to clean up; and, unlike a lock file under ``/tmp`` or ``/run``, it is seen
  across systemd's ``PrivateTmp`` and by every user). The members are forked from the command and inherit
  the descriptor, so the claim holds until the last of them has stopped, even when the command itself was
  killed first. A second command finds the name taken, and refuses to start naming the holder's pid;
- **probes** each address: it binds and listens on it itself, without ``SO_REUSEPORT``, then closes the
  socket. Linux refuses that bind while any socket listens there (a single broker, another program, members
  of a command that ran before claims existed), whether or not those set ``SO_REUSEPORT``; a port only in
  ``TIME_WAIT`` does not count (``SO_REUSEADDR``, as the members bind).

A claim also refuses an overlapping one on the same port: ``0.0.0.0`` (or every interface) and
``127.0.0.1`` clash there as the members' binds would (``sockets.hosts_overlap``). The claims made on a
port are read from ``/proc/net/unix`` (the abstract names bound in this network namespace), and a port's
claim and that read happen under a short per-port lock (another abstract name, held for milliseconds), so
that of two commands started in the same instant on overlapping hosts one starts and the other is refused.

The claim closes the race of two commands started at the same moment (both probes would pass); the probe
catches everyone who does not claim. What could still take the port between the probe and the members'
own binds is a process without ``SO_REUSEPORT``: the members then fail to bind, and the command stops with
their error.
"""

from __future__ import annotations

import errno
import socket
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from broker_edge.process.sockets import hosts_overlap, listening_sockets

__all__ = ["answer_askers", "claim_address", "claim_name", "probe_unbound"]


_CLAIMS = "timestone-broker-workers/"
_CLAIMS_LOCKED = "timestone-broker-workers-claiming/"
_LOCK_WAIT_S = 5.0
"""The longest a claim waits for another's on the same port (held for the milliseconds of a claim): past
it, the claim goes on unlocked (one held by a stopped process must not keep every later command out)."""


def claim_name(host: str, port: int) -> str:
    """The abstract Unix socket name that claims ``host:port`` (without the leading NUL)."""
    return f"{_CLAIMS}{host}:{port}"


def claim_address(endpoint: str, host: str, port: int) -> socket.socket | None:
    """Claim ``host:port`` for this process and every process forked from it: the socket to keep open for as
    long as the address is served (None where the system has no abstract namespace: nothing to claim with).
    ``OSError`` (``EADDRINUSE``) naming ``endpoint`` and the holder's pid when another process holds it."""
    if not sys.platform.startswith("linux"):
        return None
    with _claiming(port):
        claim = _bind_claim(endpoint, host, port)
        for other in _claimed_hosts(port):
            if other != host and hosts_overlap(host, other):
                claim.close()
                raise OSError(
                    errno.EADDRINUSE,
                    f"{endpoint} {host}:{port} overlaps {other}:{port}, served by another timestone broker "
                    f"--workers ({_holder(claim_name(other, port))}): give each its own port (or host)",
                )
    return claim


def _bind_claim(endpoint: str, host: str, port: int) -> socket.socket:
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind("\0" + claim_name(host, port))
        claim.listen(8)  # connected to by a refused command, to name this one (``answer_askers``)
        claim.setblocking(False)
    except OSError as error:
        claim.close()
        if error.errno != errno.EADDRINUSE:
            raise
        raise OSError(
            errno.EADDRINUSE,
            f"{endpoint} {host}:{port} is served by another timestone broker --workers "
            f"({_holder(claim_name(host, port))}): give each its own port (or host)",
        ) from None
    return claim


@contextmanager
def _claiming(port: int) -> Iterator[None]:
    """Held while this process claims an address on ``port``: claims on one port made one at a time."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                lock.bind(f"\0{_CLAIMS_LOCKED}{port}")
                break
            except OSError as error:
                if error.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
        yield
    finally:
        lock.close()


def _claimed_hosts(port: int) -> list[str]:
    """The hosts claimed on ``port`` in this network namespace (this process's own included), as
    ``/proc/net/unix`` lists the abstract names bound; none where it cannot be read."""
    prefix, suffix = f"@{_CLAIMS}", f":{port}"
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as table:
            paths = [line.split()[-1] for line in table if len(line.split()) >= 8]
    except OSError:
        return []
    return sorted(
        {
            path[len(prefix) : -len(suffix)]
            for path in paths
            if path.startswith(prefix) and path.endswith(suffix)
        }
    )


def answer_askers(claim: socket.socket) -> None:
    """Close the connections refused commands made to ``claim`` to read its holder's pid: left queued, a
    full queue would leave the next one unable to tell (the holder's command calls this now and then)."""
    while True:
        try:
            asker, _ = claim.accept()
        except OSError:  # BlockingIOError: none left
            return
        asker.close()


def probe_unbound(endpoint: str, host: str, port: int) -> None:
    """``OSError`` naming ``endpoint`` when ``host:port`` cannot be listened on without ``SO_REUSEPORT``:
    another process listens there (or the address is not this host's, or the port needs a privilege)."""
    try:
        sockets = listening_sockets(host, port, 1, reuse_port=False)
    except OSError as error:
        reason = error.strerror or str(error)
        taken = " (another process listens there)" if error.errno == errno.EADDRINUSE else ""
        raise OSError(error.errno, f"{endpoint} cannot listen on {host}:{port}: {reason}{taken}") from None
    for sock in sockets:
        sock.close()


def _holder(name: str) -> str:
    """``pid N`` of the process that holds the claim ``name`` (what the kernel says of the socket's
    listener), or a phrase when it cannot be told."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect("\0" + name)
            credentials = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return "pid unknown"
    pid, _, _ = struct.unpack("3i", credentials)
    return f"pid {pid}" if pid > 0 else "pid unknown"
