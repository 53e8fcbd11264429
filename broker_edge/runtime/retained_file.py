"""The retained file: a broker alone keeps its retained messages across a restart (see docs/broker.md).

``RetainedFile`` reads ``meta/retained.bin`` in the storage directory once at start and puts its messages
back into the router's retained store (within the current bounds; one whose Message Expiry Interval passed
while the broker was down is dropped), writes it when the set changed since the last write, every
``sessions.persist_interval_s`` (encoded and written off the loop), and a last time at stop. The file is
a header with the time it was written, then per message its topic, log offset and record frame
(``engine.records``: payload, QoS, properties, publisher and what remains of its expiry). Every write is
atomic (a temporary file, fsync, rename, fsync of the directory). A file that cannot be read is logged,
moved aside and the broker starts without retained messages.
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
from broker_edge.storage.record import FrameError, decode_frame, encode_frame
from broker_edge.storage.segment import fsync_directory

if TYPE_CHECKING:
    from collections.abc import Iterable

    from broker_edge.engine.message import Message
    from broker_edge.engine.routing.router import Router

__all__ = ["RETAINED_FILE", "RetainedFile"]

log = logging.getLogger(__name__)

RETAINED_FILE = "retained.bin"
_HEADER = struct.Struct("<8sd")
_MAGIC = b"TSRET001"
_ENTRY = struct.Struct("<IqI")  # topic bytes, log offset (-1: none), frame bytes
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
        parts += (_ENTRY.pack(len(raw), offset, len(frame)), raw, frame)
    return b"".join(parts)


def decode_messages(body: memoryview, now: float) -> list[Message]:
    """The messages of a body; their expiry counts from ``now``. ``ValueError`` when it is not well formed."""
    messages: list[Message] = []
    pos = 0
    while pos < len(body):
        topic_size, offset, frame_size = _ENTRY.unpack_from(body, pos)
        pos += _ENTRY.size
        topic = str(body[pos : pos + topic_size], "utf-8")
        frame = bytes(body[pos + topic_size : pos + topic_size + frame_size])
        pos += topic_size + frame_size
        if pos > len(body):
            raise ValueError("truncated")
        try:
            message = message_of_frame(topic, decode_frame(frame, 0, _MAX_BODY), now)
        except FrameError as error:
            raise ValueError(f"bad record frame: {error}") from None
        message.offset = None if offset < 0 else offset
        messages.append(message)
    return messages


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
            if magic != _MAGIC:
                raise ValueError("not a retained file")
            down_s = max(0.0, time.time() - written_at)
            messages = decode_messages(memoryview(data)[_HEADER.size :], time.monotonic() - down_s)
        except (ValueError, struct.error) as exc:
            return self._refuse(f"is corrupt ({exc})")
        kept = sum(1 for m in messages if not m.expired() and self.router.retain(m))
        self._written = self.router.retained.changes
        log.info("restored %d retained messages from %s", kept, self.path)
        return kept

    def _refuse(self, why: str) -> int:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        with contextlib.suppress(OSError):
            os.replace(self.path, aside)
        log.error("retained messages not restored: %s %s; starting without them", self.path, why)
        return 0

    def tick(self, now: float) -> None:
        """Write the set in the background when it changed and the interval passed (the sweep calls it)."""
        if now < self._next_write or (self._writing is not None and not self._writing.done()):
            return
        self._next_write = now + self.interval_s
        if self.router.retained.changes != self._written:
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
            log.error("retained messages not saved to %s: %s (the last file stays)", self.path, exc)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
