"""The topic catalog: every topic's name, dense id and partition, in one append-only file.

File layout (little endian): a 16-byte header (``TSCT``, u16 version, zeros), then one entry per topic in id
order::

    u32 body_length | u32 crc32c(body) | body = u32 topic_id | u16 partition | name (UTF-8)

A new topic's entry is buffered like an append and written and synced by the same group-commit job as the
topic's first record (`take_write`), so a record that was acknowledged never names an id the file lost.
At open a torn or damaged entry at the end is cut off (with the records naming ids past it, which were
never acknowledged either), unless a sealed segment or the topic table snapshot shows that it was durable:
then its topic keeps a lost name and is set aside (`keep_lost_end`, see `lost_files`), as are the topics of
entries damaged between valid ones (`damaged`). Names never reach a path: any MQTT topic name is fine here.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import time
from array import array

from . import record
from .errors import StoreDamaged
from .segment import FileWrite, fsync_directory
from .topic_ids import TopicIds

__all__ = ["CATALOG_FILE", "CatalogDamaged", "TopicCatalog"]

log = logging.getLogger(__name__)

CATALOG_FILE = "catalog"
MAGIC = b"TSCT"
VERSION = 1
HEADER = struct.Struct("<4sH10x")
EMPTY_CRC = 0xDD1C82DA
"""CRC32C of a catalog that is only its header: a new data directory opens without loading `crc32c`."""
PREFIX = struct.Struct("<II")
BODY_HEAD = struct.Struct("<IH")
ENTRY_HEAD = struct.Struct("<IIIH")
"""An entry's prefix and body head: length, CRC, topic id, partition."""


LOST_NAME = "\x00lost catalog entry {}"
"""The name kept for a topic id whose entry is damaged: U+0000 is in no MQTT topic name [MQTT-1.5.4-2]."""
_SHORTEST_ENTRY = PREFIX.size + BODY_HEAD.size


def _next_entry(data: bytes, position: int, expected: int) -> int | None:
    """Where the next valid entry after damage at `position` starts, the ids from `expected` up to its own
    being lost (at most one per shortest entry the damage spans); None: no valid entry follows (a torn or
    damaged end). Tries the damaged entry's own length first, then every byte after it."""
    view = memoryview(data)
    size = len(data)

    def valid(at: int) -> bool:
        if at + ENTRY_HEAD.size > size:
            return False
        length, checksum, topic_id, _partition = ENTRY_HEAD.unpack_from(data, at)
        end = at + PREFIX.size + length
        if not expected < topic_id <= expected + (at - position) // _SHORTEST_ENTRY or end > size:
            return False
        if length < BODY_HEAD.size or record.crc32c(view[at + PREFIX.size : end]) != checksum:
            return False
        try:
            data[at + ENTRY_HEAD.size : end].decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    own = position + PREFIX.size + PREFIX.unpack_from(data, position)[0]
    if own < size and valid(own):
        return own
    return next((at for at in range(position + 1, size - ENTRY_HEAD.size + 1) if valid(at)), None)


class CatalogDamaged(StoreDamaged):
    """The catalog file is not one (a foreign file, or its header is damaged): nothing can be trusted."""


class TopicCatalog:
    """Topic names <-> ids, and each topic's partition; the file is only ever appended to."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.names: list[str] = []
        """Topic names by id."""
        self.ids = TopicIds(self.names)
        self.partitions = array("H")
        """Each topic's partition, by id."""
        self._size = HEADER.size
        """Bytes of the file once everything taken for writing is written."""
        self._file_size = HEADER.size
        """Bytes the file held when it was loaded."""
        self._pending: list[bytes] = []
        self._created = False
        self.damaged: dict[int, str] = {}
        """Topic ids whose entry is damaged between valid ones (their names lost): why, to set them aside."""

    def __len__(self) -> int:
        return len(self.names)

    def load(self, trusted_bytes: int = 0, trusted_crc: int | None = None) -> int:
        """Read the file (create it when missing); returns the bytes of a torn or damaged end, which
        `cut_torn_end` cuts once the caller found that no record names the ids they held.

        `trusted_bytes` of the file whose CRC32C is `trusted_crc` (a snapshot's record of it) are checked with
        one CRC, not entry by entry."""
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            self._create()
            return 0
        if len(data) < HEADER.size or HEADER.unpack_from(data) != (MAGIC, VERSION):
            raise CatalogDamaged(self._refusal(data))
        verified = 0
        if (
            trusted_crc is not None
            and HEADER.size < trusted_bytes <= len(data)
            and record.crc32c(memoryview(data)[:trusted_bytes]) == trusted_crc
        ):
            verified = trusted_bytes
        end = self._parse(data, verified)
        self._size = end
        self._file_size = len(data)
        self._created = True
        return len(data) - end

    def cut_torn_end(self) -> None:
        """Cut the torn or damaged end `load` found (nothing when there is none), durably."""
        if self._file_size <= self._size:
            return
        log.warning(
            "%s: cut %d bytes of a torn or damaged entry at its end", self.path, self._file_size - self._size
        )
        os.truncate(self.path, self._size)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._file_size = self._size

    def _parse(self, data: bytes, verified: int) -> int:
        """Add the entries of `data` (those before `verified` known good); returns where the good ones end.

        One `unpack_from` per entry and names decoded from bytes slices: at a million topics this loop is
        most of a clean open's CPU."""
        view = memoryview(data)
        names, partitions = self.names, self.partitions
        add_name, add_partition = names.append, partitions.append
        unpack_head = ENTRY_HEAD.unpack_from
        crc32c = record.crc32c
        position = HEADER.size
        size = len(data)
        while position + ENTRY_HEAD.size <= size:
            length, checksum, topic_id, partition = unpack_head(data, position)
            end = position + PREFIX.size + length
            name = None
            if (
                length >= BODY_HEAD.size
                and end <= size
                and topic_id == len(names)
                and (end <= verified or crc32c(view[position + PREFIX.size : end]) == checksum)
            ):
                try:
                    name = data[position + ENTRY_HEAD.size : end].decode("utf-8")
                except UnicodeDecodeError:
                    name = None
            if name is None:
                resumed = _next_entry(data, position, len(names))
                if resumed is None:
                    break  # a torn or damaged end (`cut_torn_end`, `lost_files.check_catalog_end`)
                after = BODY_HEAD.unpack_from(data, resumed + PREFIX.size)[0]
                self._lost(position, resumed, after, partition)
                position = resumed
                continue
            add_name(name)
            add_partition(partition)
            position = end
        try:
            self.ids = TopicIds(names)
        except ValueError:
            raise CatalogDamaged(f"{self.path} names a topic twice") from None
        return position

    def _lost(self, position: int, resumed: int, after: int, partition: int) -> None:
        """Entries damaged from `position` up to the valid one at `resumed` (of topic id `after`): their ids
        keep a name no MQTT topic can have (it holds U+0000) and are set aside (`damaged`), so the entries
        after them are read and every other log opens. The first one keeps the partition its entry says
        (checked like any entry's: `recovery._set_aside_strays`), the others partition 0."""
        first = len(self.names)
        reason = (
            f"its entry in {self.path} is damaged (bytes {position} to {resumed}): its name is lost, its "
            "records are kept on disk, neither read nor written"
        )
        for topic_id in range(first, after):
            self.names.append(LOST_NAME.format(topic_id))
            self.partitions.append(partition if topic_id == first else 0)
            self.damaged[topic_id] = reason
        log.error(
            "%s: bytes %d to %d are damaged (the entries of topic ids %d to %d): their names are lost and "
            "their logs set aside; the entries after them are read",
            self.path, position, resumed, first, after - 1,
        )  # fmt: skip

    def keep_lost_end(self, count: int, why: str) -> None:
        """The damaged end held the entries of `count` topics whose records are durable (`why`): the file is
        copied aside (``catalog.damaged-<unix time>``), cut after its good entries, and given an entry for
        each under a lost name (`LOST_NAME`), synced; they are set aside (`damaged`), their records kept on
        disk, and every other log opens."""
        aside = f"{self.path}.damaged-{int(time.time())}"
        shutil.copyfile(self.path, aside)
        first = len(self.names)
        log.error(
            "%s is damaged: %s; the entries of topic ids %d to %d are lost: their logs are set aside under "
            "lost names, the file as it was is kept as %s",
            self.path, why, first, first + count - 1, aside,
        )  # fmt: skip
        self.cut_torn_end()
        reason = f"its entry in {self.path} is lost ({why}): its name is lost, its records are kept on disk"
        for topic_id in range(first, first + count):
            self.add(LOST_NAME.format(topic_id), 0)
            self.damaged[topic_id] = reason
        write = self.take_write()
        assert write is not None
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, b"".join(write.data), write.position)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._file_size = self._size

    def _refusal(self, data: bytes) -> str:
        """Why a file without this version's header is not read, and what its operator can do."""
        version = HEADER.unpack_from(data)[1] if len(data) >= HEADER.size else 0
        if data[: len(MAGIC)] == MAGIC and version > VERSION:
            return (
                f"{self.path} is a topic catalog of version {version}, and this Timestone reads version "
                f"{VERSION}: start the Timestone that wrote it"
            )
        store = os.path.dirname(os.path.dirname(self.path))
        return (
            f"{self.path} is not a topic catalog of version {VERSION} ({len(data)} bytes, its header "
            f"damaged): put it back from a backup, or move {store} aside to start with an empty store"
        )

    def _create(self) -> None:
        directory = os.path.dirname(self.path)
        temporary = self.path + ".tmp"
        with open(temporary, "wb") as file:
            file.write(HEADER.pack(MAGIC, VERSION))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)
        fsync_directory(directory)
        self._size = HEADER.size
        self._created = True

    def add(self, name: str, partition: int) -> int:
        """Give `name` the next id (its entry is written with the next job); returns the id."""
        topic_id = len(self.names)
        raw = name.encode("utf-8")
        body = BODY_HEAD.pack(topic_id, partition) + raw
        self._pending.append(PREFIX.pack(len(body), record.crc32c(body)) + body)
        self.names.append(name)
        self.ids.added(topic_id)
        self.partitions.append(partition)
        return topic_id

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def take_write(self) -> FileWrite | None:
        """The entries added since the last take, as one write at the end of the file (None: nothing)."""
        if not self._pending:
            return None
        data, self._pending = self._pending, []
        write = FileWrite(self.path, data, self._size, always_sync=True)
        self._size += sum(map(len, data))
        return write

    @property
    def size(self) -> int:
        """Bytes of the file once every entry taken is written."""
        return self._size
