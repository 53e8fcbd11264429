"""The offsets API's reads by storage partition: every topic's records in log order, by position.

    GET /v1/partitions                                     each partition's [start, end) in positions
    GET /v1/partitions/{p}/position?timestamp_ms=          the position of the first record at or after a time
    GET /v1/partitions/{p}/records?position=&max_entries=&max_bytes=&pattern=...   (Arrow)
    GET /v1/partitions/{p}/removed?since=&pattern=...      topics whose records retention deleted past `since`

A reader of many topics (the Spark source over 100,000 device topics) keeps one position per partition
instead of an offset per topic (docs/offsets-api.md, docs/commitlog.md "Whole partitions"). Positions are
a broker's own: a cluster's member answers 404 here, and its readers use topic offsets.

A read is done in slices of `SLICE_S` of work with the event loop served between them, so a read of 4 MiB
never holds MQTT up for long; its Arrow answer (tens of milliseconds of CPU for 50,000 rows of as many
topics) is built in a thread of the loop's executor, which the loop's thread takes the interpreter back from
every switch interval (5 ms). Slices and answers are pieces of the loop's HTTP work: each waits for its
turn, one at a time (``http.read_gate.WorkTurns``).
"""

from __future__ import annotations

import json
import time
from array import array
from typing import Any

from aiohttp import web

from broker_edge.bounds import MAX_OFFSET
from broker_edge.http.guard import hold, reads_of
from broker_edge.http.read_gate import ReadGate, work_in_thread, work_turn
from broker_edge.storage import LogStore, PositionOutOfRange

from . import errors as codes
from .formats import ARROW_CONTENT_TYPE, PARTITION_METADATA_KEYS
from .requests import (
    ANSWER_OVERHEAD,
    ApiError,
    ApiLimits,
    ExpectHandler,
    access_of,
    format_param,
    int_param,
)

__all__ = ["add_partition_routes", "position_out_of_range"]

SLICE_ENTRIES = 256
"""Entries read between two looks at the clock (about 1.5 ms of CPU with a topic per entry)."""
SLICE_S = 0.002
DEFAULT_MAX_ENTRIES = 100_000


def add_partition_routes(
    app: web.Application, store: LogStore, limits: ApiLimits, expect: ExpectHandler | None = None
) -> None:
    """The partitions' endpoints; ``expect`` answers their ``Expect`` header (aiohttp's when None)."""
    handlers = _PartitionHandlers(store, limits)
    app.router.add_get("/v1/partitions", handlers.list_partitions, expect_handler=expect)
    app.router.add_get(
        "/v1/partitions/{partition}/position", handlers.position_for_timestamp, expect_handler=expect
    )
    app.router.add_get("/v1/partitions/{partition}/records", handlers.records, expect_handler=expect)
    app.router.add_get("/v1/partitions/{partition}/removed", handlers.removed, expect_handler=expect)


def position_out_of_range(error: PositionOutOfRange) -> ApiError:
    return ApiError(
        416,
        codes.POSITION_OUT_OF_RANGE,
        str(error),
        partition=error.partition,
        position=error.position,
        start_position=error.start,
        end_position=error.end,
    )


class _PartitionHandlers:
    def __init__(self, store: LogStore, limits: ApiLimits) -> None:
        self.store = store
        self.limits = limits

    def _check_served(self, request: web.Request) -> None:
        if self.store.replicated_log.enabled:
            message = "a cluster's member is read by topic offsets, not by partition positions"
            raise ApiError(404, codes.NOT_FOUND, message)
        access = access_of(request)
        if access.topics is not None and "#" not in access.topics:  # a partition holds every topic's records
            message = f"{access.name} may read some topics only: it reads by topic offsets, not by partition"
            raise ApiError(403, codes.FORBIDDEN, message)

    def _partition(self, request: web.Request) -> int:
        self._check_served(request)
        count = len(self.store.partitions())
        return int_param(request.match_info["partition"], "partition", 0, 0, count - 1)

    async def list_partitions(self, request: web.Request) -> web.Response:
        self._check_served(request)
        listed = [
            {"partition": info.partition, "start_position": info.start, "end_position": info.end}
            for info in self.store.partitions()
        ]
        return web.json_response({"partitions": listed})

    async def position_for_timestamp(self, request: web.Request) -> web.Response:
        partition = self._partition(request)
        value = request.query.get("timestamp_ms")
        if value is None:
            raise ApiError(400, codes.BAD_REQUEST, "timestamp_ms is required (milliseconds since the epoch)")
        timestamp = int_param(value, "timestamp_ms", 0, 0, 2**63 - 1)
        position = self.store.position_for_timestamp(partition, timestamp)
        return web.json_response({"partition": partition, "timestamp_ms": timestamp, "position": position})

    async def removed(self, request: web.Request) -> web.Response:
        """The topics matching `pattern` whose records retention deleted with their segments at or past
        position `since` (``removed_account``): a reader that finds positions it has not read deleted asks
        whether its topics lost records there."""
        partition = self._partition(request)
        since = int_param(request.query.get("since"), "since", 0, 0, MAX_OFFSET)
        patterns = _patterns(request)
        try:
            removed = self.store.removed_below(partition, since, patterns or None)
        except ValueError as error:
            raise ApiError(400, codes.BAD_REQUEST, f"bad pattern: {error}", parameter="pattern") from None
        return web.json_response(
            {"partition": partition, "since": since, "accounted_from": removed.accounted_from,
             "removed_below": removed.topics}
        )  # fmt: skip

    async def records(self, request: web.Request) -> web.Response:
        partition = self._partition(request)
        query = request.query
        limits = self.limits
        format_param(query.get("format"), {"arrow": ARROW_CONTENT_TYPE})
        position = int_param(query.get("position"), "position", -1, 0, MAX_OFFSET)
        if position < 0:
            raise ApiError(400, codes.BAD_REQUEST, "position is required", parameter="position")
        max_entries = int_param(
            query.get("max_entries"), "max_entries", DEFAULT_MAX_ENTRIES, 1, DEFAULT_MAX_ENTRIES
        )
        max_bytes = int_param(
            query.get("max_bytes"), "max_bytes", limits.default_batch_bytes, 1, limits.max_bytes
        )
        patterns = _patterns(request)
        hold(request, max_bytes + ANSWER_OVERHEAD)  # what the read and the answer built from it may hold
        try:
            topics, frames, next_position, lost, damaged, removed = await self._read(
                partition, position, max_entries, max_bytes, patterns or None, reads_of(request)
            )
        except PositionOutOfRange as error:
            raise position_out_of_range(error) from None
        except ValueError as error:
            raise ApiError(400, codes.BAD_REQUEST, f"bad pattern: {error}", parameter="pattern") from None
        info = self.store.partitions()[partition]
        values: dict[str, Any] = {
            "next_position": next_position,
            "start_position": info.start,
            "end_position": info.end,
            "lost": json.dumps(lost),
            "damaged": damaged,
            "removed": removed,
        }
        metadata = {PARTITION_METADATA_KEYS[key]: str(value).encode() for key, value in values.items()}
        # the frames are copies joined from the segments' bytes (immutable): a thread may read them, one
        # answer at a time, as a piece of the loop's HTTP work (``read_gate.work_in_thread``)
        body = await work_in_thread(reads_of(request), _arrow_body, topics, frames, metadata)
        return web.Response(body=body, content_type=ARROW_CONTENT_TYPE)

    async def _read(
        self,
        partition: int,
        position: int,
        max_entries: int,
        max_bytes: int,
        patterns: list[str] | None,
        gate: ReadGate | None = None,
    ) -> tuple[list[str], _Frames, int, dict[str, int], int, int]:
        """Read in slices, each after the last waiting for its turn of the loop's HTTP work (``work_turn``
        on ``gate``, the request's socket; the read may go on after new appends: it stops at `position +
        max_entries` whatever the partition's end has become)."""
        stop = position + max_entries
        topics: list[str] = []
        frames = _Frames()
        lost: dict[str, int] = {}
        damaged = removed = 0
        budget = max_bytes
        slice_end = time.monotonic() + SLICE_S
        while position < stop and budget > 0:
            read = self.store.read_partition(
                partition, position, min(SLICE_ENTRIES, stop - position), budget, patterns
            )
            size = sum(len(frame) for frame in read.frames)
            if read.frames and frames.sizes and size > budget:
                break  # a frame larger than the rest of the budget: the next read starts with it
            topics += read.topics
            frames.add(read.frames)
            budget -= size
            for topic, count in read.lost.items():
                lost[topic] = lost.get(topic, 0) + count
            damaged += read.damaged
            removed += read.removed
            asked = min(SLICE_ENTRIES, stop - position)
            stopped_early = read.next_position < position + asked  # by the budget, or at the partition's end
            position = read.next_position
            if stopped_early:
                break
            if time.monotonic() >= slice_end:
                await work_turn(gate)
                slice_end = time.monotonic() + SLICE_S
        return topics, frames, position, lost, damaged, removed


def _patterns(request: web.Request) -> list[str]:
    patterns = request.query.getall("pattern", [])
    if any(not pattern for pattern in patterns):
        message = "a pattern is a non-empty MQTT filter"
        raise ApiError(400, codes.BAD_REQUEST, message, parameter="pattern")
    return patterns


class _Frames:
    """The frames of a read, each slice's joined into one bytes object at once, with their sizes.

    A read of 50,000 records kept a `memoryview` per frame until its answer was built: objects the garbage
    collector tracks, promoted and walked by its collections (a collection of the middle generation held
    the event loop for 50 ms). Joined per slice, the views die young and the read holds a few objects."""

    __slots__ = ("pieces", "sizes")

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.sizes = array("q")

    def add(self, frames: list[memoryview]) -> None:
        if frames:
            self.pieces.append(b"".join(frames))
            self.sizes.extend(len(frame) for frame in frames)


def _arrow_body(topics: list[str], frames: _Frames, metadata: dict[bytes, bytes]) -> memoryview:
    from broker_edge.storage.frame_runs import run_of_joined

    from .arrow_format import arrow_stream
    from .arrow_runs import arrow_batch_of_rows

    run = run_of_joined(b"".join(frames.pieces), frames.sizes, 0)
    return memoryview(arrow_stream(arrow_batch_of_rows(topics, run), metadata))
