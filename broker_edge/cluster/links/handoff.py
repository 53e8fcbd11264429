"""Clients' connections moved between the members on one host: this member's end of it.

A member listens on an abstract Unix socket (Linux: a name, no file) of a random name, which its member record
advertises (``Member.handoff``). Such a socket is reachable only from its network namespace, so a member that
connects to it runs on the same host. A member that forwards a client's publishes to the leader of their
partition, when the leader advertises a name that connects, hands the client's connection over to it
(``hand_over``): nothing more of it is read here, and once the publishes it sent are answered and the answers
written (within ``MOVE_WITHIN_S``, else it stays and is read again), the TCP socket's descriptor, what the
client's CONNECT settled and the bytes read and not yet handled (``engine.connection.handover``) go in one
message (``SOCK_SEQPACKET``, ``SCM_RIGHTS``), with the session registry's record this member wrote for the
client (``CarriedClaims``: the leader swaps it for its own without reading it first); the connection ends here
without a word, and the leader takes it in (``Adopt``): the client goes on publishing on the same TCP
connection, now to the member that appends its topic, and nothing of it is forwarded any more.

Both ends admit only a process of this process's user (``SO_PEERCRED``): a client's socket is never given to
another user's process, nor taken from one. A name that does not connect (a member on another host, gone, or
not this user's) is not tried again for ``RETRY_S``; the publishes go on being forwarded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import secrets
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["MAX_RECORD", "MOVE_WITHIN_S", "RETRY_S", "Adopt", "CarriedClaims", "ConnectionHandoff", "Movable"]

log = logging.getLogger("broker_edge.cluster.handoff")

RETRY_S = 30.0
"""How long a member's handoff name that did not connect is left untried."""

MOVE_WITHIN_S = 1.0
"""How long a connection held for moving waits for the answers to its publishes read before it stays."""

RECHECK_S = 0.01
"""How often connections held for moving are looked at again while any waits."""

MAX_RECORD = 128 * 1024
"""The largest message a handoff carries: a connection whose record and unread bytes would not fit stays
(a will that moves takes at most 22 KiB of it, base64)."""

_MAX_LINKS = 64
"""Links to other members' handoff sockets kept open (a member started again has a new name)."""

_RECEIVES_PER_TURN = 64
"""Messages one link's reader takes per turn of the loop before it lets the loop go round."""

_PEERCRED = struct.Struct("3i")


class Movable(Protocol):
    """A client's connection as a handoff moves it (``runtime.transports.tcp.TcpConnection``)."""

    def may_move(self) -> bool:
        """Whether it may move once its publishes read are answered."""

    def hold_for_handover(self) -> None:
        """Read nothing more of it here."""

    def handover_record(self) -> dict[str, Any] | None:
        """What moves with it, or None while it cannot move now."""

    def handover_socket(self) -> tuple[int, bytes] | None:
        """Its socket's descriptor, reading paused, and the bytes read and not handled; None while it
        cannot move now."""

    def resume_after_handover(self, unread: bytes = b"") -> None:
        """It does not move: handle ``unread`` (what ``handover_socket`` took out), then read it again."""

    def handed_over(self, node: str) -> None:
        """The socket went to ``node``: end the connection here without a word to the client."""


@dataclass(slots=True)
class _Move:
    node: str
    name: str
    until: float


class CarriedClaims(Protocol):
    """The session registry's side of a handoff (``cluster.features.sessions.ClusterSessions``): the
    record this member wrote of a client's session goes with its connection, and the member taking it in
    writes it from then on."""

    def carried(self, client_id: str) -> dict[str, int] | None:
        """What of this member's record of ``client_id`` goes with its connection (None: nothing)."""

    def moved_away(self, client_id: str) -> None:
        """``client_id``'s connection went to another member: its record is no longer this member's to
        keep current."""


Adopt = Callable[[dict[str, Any], socket.socket, str], None]
"""Take in a connection moved here: ``(record, its TCP socket, the member it came from)``; raises
``ValueError`` for a record it cannot take (the socket is closed then)."""


def _same_user(sock: socket.socket) -> bool:
    """Whether the process at the other end of a Unix socket runs as this process's user."""
    _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return uid == os.geteuid()


class ConnectionHandoff:
    """This member's handoff socket and its links to the other members' (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        loop: asyncio.AbstractEventLoop,
        adopt: Adopt,
        counted: Callable[[str], None] = lambda _outcome: None,
    ) -> None:
        self.node_id = node_id
        self.loop = loop
        self.adopt = adopt
        self.counted = counted
        """Told each outcome: ``out`` (handed over), ``in`` (taken in), ``stayed`` (held for moving, then
        read here again)."""
        self.name = f"timestone-handoff-{secrets.token_hex(16)}"
        """The name this member advertises (``HANDOFF_NAME``)."""
        self._listening = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._listening.bind("\0" + self.name)
            self._listening.listen(64)
            self._listening.setblocking(False)
        except OSError:
            self._listening.close()
            raise
        self._accepted: set[socket.socket] = set()
        self._links: dict[str, socket.socket] = {}
        self._untried_until: dict[str, float] = {}
        self._moving: dict[Movable, _Move] = {}
        """Connections held for moving, until they move or stay."""
        self._scheduled = False
        self._retry: asyncio.TimerHandle | None = None
        self._serving = False
        self.claims: CarriedClaims | None = None
        """The session registry's records that go with the connections handed over (None: none)."""

    def start(self) -> None:
        """Take in what the other members hand over."""
        if not self._serving:
            self._serving = True
            self.loop.add_reader(self._listening.fileno(), self._accept_ready)

    def close(self) -> None:
        """Take nothing more in, hand nothing more over (connections held for moving are read again)."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        moving, self._moving = self._moving, {}
        for conn in moving:
            conn.resume_after_handover()
        if self._serving:
            self._serving = False
            self.loop.remove_reader(self._listening.fileno())
        self._listening.close()
        for sock in self._accepted:
            self.loop.remove_reader(sock.fileno())
            sock.close()
        self._accepted.clear()
        for link in self._links.values():
            link.close()
        self._links.clear()

    # -- handing over -------------------------------------------------------------------------------------

    def reaches(self, name: str) -> bool:
        """Whether a handoff to ``name`` may be tried now."""
        return name in self._links or self.loop.time() >= self._untried_until.get(name, 0.0)

    def hand_over(self, conn: Movable, node: str, name: str) -> None:
        """Move ``conn`` to member ``node`` (its handoff socket ``name``): nothing more of it is read here,
        and it moves once its publishes read are answered and the answers written, at most
        ``MOVE_WITHIN_S`` from now (else it stays, and is read again)."""
        if conn not in self._moving:
            conn.hold_for_handover()
            self._moving[conn] = _Move(node, name, self.loop.time() + MOVE_WITHIN_S)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._move_all)  # after this turn's writes

    def _move_all(self) -> None:
        self._scheduled = False
        now = self.loop.time()
        for conn, move in list(self._moving.items()):
            self._move(conn, move, now)
        if self._moving and self._retry is None:
            self._retry = self.loop.call_later(RECHECK_S, self._recheck)

    def _recheck(self) -> None:
        self._retry = None
        self._move_all()

    def _move(self, conn: Movable, move: _Move, now: float) -> None:
        """Move ``conn`` now if it can; leave it waiting while it may still; else let it stay."""
        record = conn.handover_record()
        if record is None:
            if now >= move.until or not conn.may_move():
                del self._moving[conn]
                self._stays(conn)
            return
        link = self._link(move.name)
        taken = conn.handover_socket() if link is not None else None
        if taken is None:  # not reached, or its answers still being written
            if link is None or now >= move.until:
                del self._moving[conn]
                self._stays(conn)
            return
        del self._moving[conn]
        assert link is not None
        fd, unread = taken
        record["from"] = self.node_id
        if unread:
            record["unread"] = base64.b64encode(unread).decode()
        client_id = str(record.get("client_id"))
        claims = self.claims
        if claims is not None:
            record["claim"] = claims.carried(client_id)
        message = json.dumps(record, separators=(",", ":")).encode()
        if len(message) > MAX_RECORD:  # a large packet half-read: it stays
            self._stays(conn, unread)
            return
        try:
            socket.send_fds(link, [message], [fd])
        except OSError as exc:  # its queue is full, or it went away: the connection stays, bytes and all
            if not isinstance(exc, BlockingIOError | InterruptedError):
                self._forget(move.name, f"{type(exc).__name__}: {exc}")
            self._stays(conn, unread)
            return
        self.counted("out")
        if claims is not None:
            claims.moved_away(client_id)  # before the connection ends here: its end changes no record
        conn.handed_over(move.node)

    def _stays(self, conn: Movable, unread: bytes = b"") -> None:
        self.counted("stayed")
        conn.resume_after_handover(unread)

    def _link(self, name: str) -> socket.socket | None:
        link = self._links.get(name)
        if link is not None or not self.reaches(name):
            return link
        link = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            link.setblocking(False)
            link.connect("\0" + name)
            if not _same_user(link):
                raise PermissionError("its process runs as another user")
        except OSError as exc:
            link.close()
            self._forget(name, f"{type(exc).__name__}: {exc}")
            return None
        if len(self._links) >= _MAX_LINKS:  # the oldest first: most likely to a member gone
            self._links.pop(next(iter(self._links))).close()
        self._links[name] = link
        return link

    def _forget(self, name: str, why: str) -> None:
        link = self._links.pop(name, None)
        if link is not None:
            link.close()
        if len(self._untried_until) >= 256:  # names of members long gone
            now = self.loop.time()
            self._untried_until = {key: at for key, at in self._untried_until.items() if at > now}
        self._untried_until[name] = self.loop.time() + RETRY_S
        log.info("handoff socket %s not reached (%s): its clients' publishes are forwarded", name, why)

    # -- taking in -----------------------------------------------------------------------------------------

    def _accept_ready(self) -> None:
        while True:
            try:
                sock, _ = self._listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("handoff socket: accept failed: %s", exc)
                return
            if not _same_user(sock):
                log.warning("handoff socket: refused a process of another user")
                sock.close()
                continue
            sock.setblocking(False)
            self._accepted.add(sock)
            self.loop.add_reader(sock.fileno(), self._receive, sock)

    def _receive(self, sock: socket.socket) -> None:
        for _ in range(_RECEIVES_PER_TURN):
            try:
                data, fds, flags, _ = socket.recv_fds(sock, MAX_RECORD, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.info("handoff link closed: %s", exc)
                self._drop(sock)
                return
            if not data and not fds:
                self._drop(sock)  # the other member closed it
                return
            self._take(data, fds, flags)

    def _drop(self, sock: socket.socket) -> None:
        self.loop.remove_reader(sock.fileno())
        self._accepted.discard(sock)
        sock.close()

    def _take(self, data: bytes, fds: list[int], flags: int) -> None:
        """One connection handed over: adopted, or its socket closed (the client connects again)."""
        if len(fds) != 1 or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                os.close(fd)
            log.warning("handoff: a message with %d descriptors (flags 0x%x) dropped", len(fds), flags)
            return
        try:
            client = socket.socket(fileno=fds[0])
        except OSError as exc:
            os.close(fds[0])
            log.warning("handoff: not a socket (%s)", exc)
            return
        origin = "?"
        try:
            if client.type != socket.SOCK_STREAM or client.family not in (socket.AF_INET, socket.AF_INET6):
                raise ValueError("not a TCP connection")
            record = json.loads(data)
            if not isinstance(record, dict):
                raise ValueError("the record is not an object")
            origin = str(record.get("from", "?"))
            client.setblocking(False)
            self.adopt(record, client, origin)
        except (ValueError, OSError) as exc:
            log.warning("handoff: a connection from %s not taken in (%s); closed", origin, exc)
            client.close()
            return
        self.counted("in")
