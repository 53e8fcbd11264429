"""The retained file: a broker alone keeps its retained messages across a restart (see docs/broker.md).

``RetainedFile`` reads ``meta/retained.bin`` in the storage directory once at start and puts its messages
back into the router's retained store (within the current bounds; one whose Message Expiry Interval passed
while the broker was down is dropped), writes it when the set changed since the last write, every
``sessions.persist_interval_s`` (encoded and written off the loop), and a last time at stop. The file is
a header with the time it was written, then per message its topic, log offset and record frame
(``engine.records``: payload, QoS, properties, publisher and what remains of its expiry), its topic and
offset under a CRC32C of their own (the frame has its CRC). Every write is atomic (a temporary file, fsync,
rename, fsync of the directory). A file that cannot be read is logged, moved aside and the broker starts
without retained messages; a file with damaged entries is moved aside too, its other messages restored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

from broker_edge.engine.records import message_of_frame, record_fields
from broker_edge.observe.refusal_log import FailingWrites
from broker_edge.storage.record import FrameError, crc32c, decode_frame, encode_frame
from broker_edge.storage.segment import fsync_directory

if TYPE_CHECKING:
    from collections.abc import Iterable

    from broker_edge.engine.message import Message
    from broker_edge.engine.routing.router import Router

__all__ = ["RETAINED_FILE", "RetainedFile"]

log = logging.getLogger(__name__)

RETAINED_FILE = "retained.bin"
_HEADER = struct.Struct("<8sd")
_MAGIC = b"TSRET002"
_MAGIC_UNCHECKED = b"TSRET001"
"""Written before the entries had a check of their topic and offset: still read."""
_ENTRY = struct.Struct("<IqI")  # topic bytes, log offset (-1: none), frame bytes
_CHECK = struct.Struct("<I")  # crc32c of the entry head and the topic (TSRET002)
_MAX_BODY = 64 * 1024 * 1024


def encode_messages(entries: Iterable[tuple[str, Message]]) -> bytes:
    """The messages of ``entries`` as the file's body, but ``$SYS/`` (the broker's own, published again)."""
    parts: list[bytes] = []
    for topic, message in entries:
        if topic.startswith("$SYS/"):
            continue
        raw = topic.encode()
        frame = encode_frame(0, 0, *record_fields(message))
        offset = -1 if message.offset is None else message.offset
        head = _ENTRY.pack(len(raw), offset, len(frame))
        parts += (head, _CHECK.pack(crc32c(head + raw)), raw, frame)
    return b"".join(parts)


def decode_messages(body: memoryview, now: float, checked: bool = True) -> tuple[list[Message], int]:
    """The messages of a body, and how many entries were damaged (left out: a topic or offset failing its
    check, a frame failing its CRC, or what follows a length that runs past the body, counted as one);
    their expiry counts from ``now``. ``ValueError`` when no entry can be read (not well formed)."""
    messages: list[Message] = []
    damaged = 0
    pos = 0
    check_size = _CHECK.size if checked else 0
    while pos < len(body):
        if pos + _ENTRY.size + check_size > len(body):
            damaged += 1
            break
        topic_size, offset, frame_size = _ENTRY.unpack_from(body, pos)
        start = pos + _ENTRY.size + check_size
        pos = start + topic_size + frame_size
        if pos > len(body):
            damaged += 1  # a size is damaged: nothing after it can be found
            break
        raw = body[start : start + topic_size]
        if checked and _CHECK.unpack_from(body, start - check_size)[0] != crc32c(
            bytes(body[start - check_size - _ENTRY.size : start - check_size]) + bytes(raw)
        ):
            damaged += 1
            continue
        try:
            message = message_of_frame(
                str(raw, "utf-8"), decode_frame(bytes(body[start + topic_size : pos]), 0, _MAX_BODY), now
            )
        except (FrameError, UnicodeDecodeError):
            damaged += 1
            continue
        message.offset = None if offset < 0 else offset
        messages.append(message)
    if damaged and not messages:
        raise ValueError(f"{damaged} damaged entries and no readable one")
    return messages, damaged


class RetainedFile:
    """The retained messages of ``router`` in ``directory/retained.bin`` (the store's ``meta`` directory)."""

    def __init__(
        self, directory: Path, router: Router, interval_s: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.path = directory / RETAINED_FILE
        self.router = router
        self.interval_s = interval_s
        self.loop = loop
        self._next_write = loop.time() + interval_s
        self._written = router.retained.changes
        self._writing: asyncio.Future[None] | None = None
        self._said = FailingWrites(log, "saving retained messages", self.path, "the last file stays")

    def restore(self) -> int:
        """Read the file (if any) and retain its messages again; returns how many were kept."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            return self._refuse(f"cannot be read ({exc})")
        try:
            magic, written_at = _HEADER.unpack_from(data, 0)
            if magic not in (_MAGIC, _MAGIC_UNCHECKED):
                raise ValueError("not a retained file")
            down_s = max(0.0, time.time() - written_at)
            messages, damaged = decode_messages(
                memoryview(data)[_HEADER.size :], time.monotonic() - down_s, checked=magic == _MAGIC
            )
        except (ValueError, struct.error) as exc:
            return self._refuse(f"is corrupt ({exc})")
        kept = sum(1 for m in messages if not m.expired() and self.router.retain(m))
        self._written = self.router.retained.changes
        if damaged:
            aside = self._set_aside()
            self._write(self._capture())  # the messages restored, in a file of their own at once
            log.error(
                "%s: %d of its %d retained messages are damaged (a topic, offset or frame failing its check):"
                " not restored; the others are; the file %s",
                self.path,
                damaged,
                damaged + len(messages),
                aside,
            )
        log.info("restored %d retained messages from %s", kept, self.path)
        return kept

    def _refuse(self, why: str) -> int:
        aside = self._set_aside()
        log.error("retained messages not restored: %s %s; starting without them (%s)", self.path, why, aside)
        return 0

    def _set_aside(self) -> str:
        """Move the file aside for inspection (the next write makes a new one); says where."""
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            return f"could not be moved aside ({exc})"
        return f"moved to {aside}"

    def tick(self, now: float) -> None:
        """Write the set in the background when it changed, or the last write failed, and the interval
        passed (the sweep calls it)."""
        if now < self._next_write or (self._writing is not None and not self._writing.done()):
            return
        self._next_write = now + self.interval_s
        if self.router.retained.changes != self._written or self._said.failing:
            self._writing = self.loop.run_in_executor(None, self._write, self._capture())

    async def close(self) -> None:
        """Write the set a last time (at stop), after any write under way."""
        if self._writing is not None:
            with contextlib.suppress(Exception):
                await self._writing
        if self.router.retained.changes != self._written or not self.path.exists():
            self._write(self._capture())

    def _capture(self) -> list[tuple[str, Message]]:
        """The set now (a list of references: encoding it is the writer's, off the loop)."""
        self._written = self.router.retained.changes
        return self.router.retained.items()

    def _write(self, entries: list[tuple[str, Message]]) -> None:
        data = _HEADER.pack(_MAGIC, time.time()) + encode_messages(entries)
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(temporary, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
            fsync_directory(str(self.path.parent))
        except OSError as exc:
            self._said.failed(exc)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        else:
            self._said.succeeded()
