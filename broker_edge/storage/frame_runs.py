"""Consecutive record frames kept as one buffer, checked and split into columns with numpy.

The per-record path (`record.decode_frames`) builds a Python `Record` per frame, a few microseconds each.
A reader that wants columns (the offsets API's Arrow fetches) needs no objects: a `FrameRun` keeps a range
of frames as the bytes read from the segment plus the position of every frame (the dense index gives
them), and the fixed-size header fields of all its frames are gathered at once (`HEADER`).

`checked_run` makes the checks of `decode_frames` (length prefix, CRC32C, version, offset, variable
fields) on whole arrays; only the CRC32C is one call per frame. When any check fails it returns None and
the caller decodes the range with `decode_frames`, which finds and reports the first bad frame exactly as
the per-record path does (`run_of_records` then keeps the good records before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from crc32c import crc32c

from .record import (
    FLAG_CONTENT_TYPE,
    FLAG_CORRELATION_DATA,
    FLAG_MESSAGE_EXPIRY,
    FLAG_RESPONSE_TOPIC,
    FLAG_RETAIN,
    FLAG_USER_PROPERTIES,
    FRAME_OVERHEAD,
    PACKET_ID_VERSION,
    PREFIX_SIZE,
    QOS_AT,
    U16,
    VERSIONS,
    FrameError,
    Record,
    decode_fields,
)

HEADER = np.dtype(
    {
        "names": ["body_length", "crc", "version", "offset", "timestamp_ms", "qos", "flags", "client_id_len"],
        "formats": ["<u4", "<u4", "u1", "<i8", "<i8", "u1", "u1", "<u2"],
        "offsets": [0, 4, 8, 9, 17, QOS_AT, QOS_AT + 1, QOS_AT + 2],
        "itemsize": FRAME_OVERHEAD,
    }
)
"""The fixed-size start of every frame (see `record`): prefix, then the body's fixed fields."""
FIELD_FLAGS = (
    FLAG_CONTENT_TYPE
    | FLAG_USER_PROPERTIES
    | FLAG_RESPONSE_TOPIC
    | FLAG_CORRELATION_DATA
    | FLAG_MESSAGE_EXPIRY
)
"""Flags of the fields that only a per-record parse can find (a frame without them: payload after the id)."""
_GATHER_ROWS = 8192
_ID_CHECK_MAX_BYTES = 4 * 1024 * 1024
"""Client ids totalling more are checked one by one (bounds the index of the vectorised check)."""


@dataclass(frozen=True, slots=True)
class FrameRun:
    """Valid frames of records `first` .. `end - 1` of one log, back to back in `data`.

    Frame `i` is `data[positions[i]:positions[i + 1]]` (`positions[0]` is 0, the last one `len(data)`);
    `headers[i]` its fixed fields.
    """

    first: int
    data: bytes
    positions: np.ndarray
    headers: np.ndarray

    def __len__(self) -> int:
        return len(self.headers)

    @property
    def end(self) -> int:
        """The offset after its last record."""
        return self.first + len(self.headers)

    @property
    def size(self) -> int:
        """Frame bytes (what byte limits on reads count)."""
        return len(self.data)


@dataclass(frozen=True, slots=True)
class FrameColumns:
    """The fields of consecutive frames as arrays over one buffer (what an Arrow batch is built from).

    Row `i`'s client id is `client_id_lengths[i]` bytes of `data` from `client_id_starts[i]`, its payload
    likewise; `fields` holds (row, content_type, user_properties) of the rows flagged with either.
    """

    data: bytes
    offsets: np.ndarray
    timestamps_ms: np.ndarray
    qos: np.ndarray
    retain: np.ndarray
    client_id_starts: np.ndarray
    client_id_lengths: np.ndarray
    payload_starts: np.ndarray
    payload_lengths: np.ndarray
    fields: list[tuple[int, str | None, list[tuple[str, str]]]]

    def __len__(self) -> int:
        return len(self.offsets)


def gather_rows(buffer: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """The `width` bytes of `buffer` from each of `starts`, as rows (bytes past its end repeat its last).

    Gathered `_GATHER_ROWS` rows at a time: as fast as one fancy index, with a bounded index array.
    """
    rows = np.empty((len(starts), width), np.uint8)
    columns = np.arange(width)
    for first in range(0, len(starts), _GATHER_ROWS):
        chunk = starts[first : first + _GATHER_ROWS, None] + columns
        np.take(buffer, chunk, out=rows[first : first + _GATHER_ROWS], mode="clip")
    return rows


def frame_headers(data: bytes, positions: np.ndarray) -> np.ndarray:
    """The `HEADER`s of the frames starting at `positions[:-1]` (each at least `FRAME_OVERHEAD` long)."""
    return gather_rows(np.frombuffer(data, np.uint8), positions[:-1], FRAME_OVERHEAD).view(HEADER)[:, 0]


def checked_run(data: bytes, file_positions: Sequence[int], first: int, max_body: int) -> FrameRun | None:
    """The run of the frames `data` holds (read from `file_positions[0]`; one position more than the
    frames), when every one passes the checks of `decode_frames` expecting offsets from `first`; else None.
    """
    positions = np.asarray(file_positions, np.int64) - file_positions[0]
    count = len(positions) - 1
    if count < 1 or positions[0] != 0 or positions[-1] != len(data):
        return None
    lengths = np.diff(positions)
    if lengths.min() < FRAME_OVERHEAD or lengths.max() > max_body + PREFIX_SIZE:
        return None
    headers = frame_headers(data, positions)
    if (
        np.any(headers["body_length"] != lengths - PREFIX_SIZE)
        or np.any(~np.isin(headers["version"], VERSIONS))
        or np.any(headers["offset"] != np.arange(first, first + count))
        or np.any(
            FRAME_OVERHEAD
            + headers["client_id_len"].astype(np.int64)
            + (headers["version"] == PACKET_ID_VERSION) * U16.size
            > lengths
        )
    ):
        return None
    view = memoryview(data)
    bodies = zip((positions[:-1] + PREFIX_SIZE).tolist(), positions[1:].tolist(), strict=True)
    if [crc32c(view[start:end]) for start, end in bodies] != headers["crc"].tolist():
        return None
    if not _fields_valid(data, positions, headers):
        return None
    return FrameRun(first, data, positions, headers)


def _fields_valid(data: bytes, positions: np.ndarray, headers: np.ndarray) -> bool:
    """Whether every variable field parses and is UTF-8 (as `decode_fields` requires).

    Client ids of plain frames are checked at once when they are ASCII (the usual case); frames with
    other fields, or a non-ASCII id, are parsed one by one.
    """
    starts = positions[:-1] + FRAME_OVERHEAD
    lengths = headers["client_id_len"].astype(np.int64)
    buffer = np.frombuffer(data, np.uint8)
    suspects = (headers["flags"] & FIELD_FLAGS) != 0
    total = int(lengths.sum())
    if total > _ID_CHECK_MAX_BYTES:
        suspects[:] = True
    elif total:
        ids = buffer[np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(total)]
        if ids.max() >= 0x80:
            owners = np.repeat(np.arange(len(lengths)), lengths)[ids >= 0x80]
            suspects[owners] = True
    view = memoryview(data)
    try:
        for row in np.flatnonzero(suspects).tolist():
            decode_fields(view, int(positions[row]), int(positions[row + 1]))
    except FrameError:
        return False
    return True


def run_of_frames(frames: Sequence[bytes | memoryview], first: int) -> FrameRun:
    """A run of frames known to be valid (the records of a log's tail cache, or decoded ones)."""
    return run_of_joined(b"".join(frames), [len(frame) for frame in frames], first)


def run_of_joined(data: bytes, sizes: Sequence[int], first: int) -> FrameRun:
    """A run of valid frames already joined into `data`, of `sizes` bytes each."""
    positions = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=positions[1:])
    return FrameRun(first, data, positions, frame_headers(data, positions))


def run_of_records(records: Sequence[Record], first: int) -> FrameRun:
    """The run of records `decode_frames` returned (those before a damaged frame)."""
    return run_of_frames([record.frame for record in records], first)


def frame_columns(runs: Sequence[FrameRun]) -> FrameColumns:
    """The columns of the records of `runs`, in order (runs of several logs may follow each other)."""
    if len(runs) == 1:
        data, positions, headers = runs[0].data, runs[0].positions, runs[0].headers
    else:
        data = b"".join(run.data for run in runs)
        bases = np.cumsum([0] + [run.size for run in runs[:-1]]).tolist()
        shifted = [run.positions[:-1] + base for run, base in zip(runs, bases, strict=True)]
        positions = np.concatenate([*shifted, [len(data)]])
        headers = np.concatenate([run.headers for run in runs])
    starts = positions[:-1]
    client_id_starts = starts + FRAME_OVERHEAD
    client_id_lengths = headers["client_id_len"].astype(np.int64)
    payload_starts = client_id_starts + client_id_lengths
    payload_starts += (headers["version"] == PACKET_ID_VERSION) * U16.size  # its packet id, after the id
    flags = headers["flags"]
    fields: list[tuple[int, str | None, list[tuple[str, str]]]] = []
    with_fields = np.flatnonzero(flags & FIELD_FLAGS)
    if len(with_fields):
        view = memoryview(data)
        for row in with_fields.tolist():
            _id, content_type, user_properties, payload_start, _extras = decode_fields(
                view, int(starts[row]), int(positions[row + 1])
            )
            payload_starts[row] = payload_start
            fields.append((row, content_type, user_properties))
    return FrameColumns(
        data=data,
        offsets=headers["offset"].astype(np.int64),
        timestamps_ms=headers["timestamp_ms"].astype(np.int64),
        qos=headers["qos"].astype(np.int8),
        retain=(flags & FLAG_RETAIN).astype(np.bool_),
        client_id_starts=client_id_starts,
        client_id_lengths=client_id_lengths,
        payload_starts=payload_starts,
        payload_lengths=positions[1:] - payload_starts,
        fields=fields,
    )
