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

from broker_edge.process.sockets import listening_sockets

__all__ = ["answer_askers", "claim_address", "claim_name", "probe_unbound"]


def claim_name(host: str, port: int) -> str:
    """The abstract Unix socket name that claims ``host:port`` (without the leading NUL)."""
    return f"timestone-broker-workers/{host}:{port}"


def claim_address(endpoint: str, host: str, port: int) -> socket.socket | None:
    """Claim ``host:port`` for this process and every process forked from it: the socket to keep open for as
    long as the address is served (None where the system has no abstract namespace: nothing to claim with).
    ``OSError`` (``EADDRINUSE``) naming ``endpoint`` and the holder's pid when another process holds it."""
    if not sys.platform.startswith("linux"):
        return None
    name = "\0" + claim_name(host, port)
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(name)
        claim.listen(8)  # connected to by a refused command, to name this one (``answer_askers``)
        claim.setblocking(False)
    except OSError as error:
        claim.close()
        if error.errno != errno.EADDRINUSE:
            raise
        holder = _holder(name)
        raise OSError(
            errno.EADDRINUSE,
            f"{endpoint} {host}:{port} is served by another timestone broker --workers ({holder}): "
            "give each its own port (or host)",
        ) from None
    return claim


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
            probe.connect(name)
            credentials = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return "pid unknown"
    pid, _, _ = struct.unpack("3i", credentials)
    return f"pid {pid}" if pid > 0 else "pid unknown"
