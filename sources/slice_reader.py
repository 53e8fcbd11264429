"""The executor side of the ``timestone`` source: fetch planned slices completely, as Arrow, with no Spark.

A Spark task gets one broker's slices (``offsets_planner.Slice``) and must yield exactly their records: a
fetch may return fewer records than asked (byte budgets), so it fetches again from each topic's next offset
until every slice is complete. Records the broker no longer has are data loss, handled per
``failOnDataLoss``. Batches go to Spark as they came from the offsets API (Arrow IPC), with a broker column
added and cheap casts only: no per-record Python here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import numpy as np
import pyarrow as pa

from broker_edge.offsets_api.client import BatchFetch, OffsetsClient, TopicResult
from broker_edge.offsets_api.errors import (
    NO_OFFSETS_API,
    AuthError,
    BrokerUnavailable,
    CorruptRecordError,
    OffsetOutOfRangeError,
    OffsetsApiError,
    TlsRefused,
    UnknownTopicError,
)
from broker_edge.security.client_tls import ClientTls, context_for

from .broker_stores import answer_store_matches
from .offsets_planner import DataLossError, Slice

__all__ = [
    "SOURCE_ARROW_SCHEMA",
    "BrokerAuthError",
    "BrokerUnreachableError",
    "FetchSettings",
    "SliceProgress",
    "Taken",
    "fetch_round",
    "log_lost",
    "pending_slices",
    "read_slices",
    "site_columns",
    "take_answer",
    "to_source_batch",
]

log = logging.getLogger(__name__)

# What Spark expects from read() for the source schema (sinks.spark_arrow.to_arrow(SCHEMA)).
SOURCE_ARROW_SCHEMA = pa.schema(
    [
        ("broker", pa.string()),
        ("topic", pa.string()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("client_id", pa.string()),
        ("qos", pa.int32()),
        ("retain", pa.bool_()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("payload", pa.binary()),
    ]
)
# The offsets API refuses larger per-topic record counts (its ApiLimits.max_records default).
MAX_RECORDS_PER_REQUEST = 100_000

T = TypeVar("T")


class BrokerUnreachableError(RuntimeError):
    """A broker's offsets API did not answer within the retries; the message names the broker."""

    def __init__(
        self, broker: str, url: str, waited_s: float, cause: BaseException, needed_for: str = ""
    ) -> None:
        need = f"{needed_for}, but " if needed_for else ""
        super().__init__(
            f"timestone source: {need}broker {broker!r} ({url}) unreachable, gave up after {waited_s:.1f} s: "
            f"{cause} (see the options fetchRetries, retryBackoffMs, fetchTimeoutMs)"
        )
        self.broker = broker
        self.url = url
        self.waited_s = waited_s
        self.cause = cause

    def needed_for(self, what: str) -> BrokerUnreachableError:
        """This error, saying first what the broker's answer was needed for."""
        return BrokerUnreachableError(self.broker, self.url, self.waited_s, self.cause, what)


class BrokerAnswerError(RuntimeError):
    """A broker's offsets API answered the source's listing with an error (not a refused token); the message
    names the broker, its URL and, for a 404, that no offsets API answers there."""

    def __init__(self, broker: str, url: str, cause: OffsetsApiError) -> None:
        hint = f": {NO_OFFSETS_API}" if cause.status == 404 else ""
        super().__init__(
            f"timestone source: broker {broker!r} ({url}) answered its listing with {cause}{hint} "
            "(see the option brokers)"
        )
        self.broker = broker
        self.status = cause.status


class BrokerAuthError(PermissionError):
    """A broker refused the token (authToken / authToken.<broker id>), or TLS between the two failed for a
    reason no retry mends (``TlsRefused``: caFile, certFile, keyFile)."""

    def __init__(self, broker: str, url: str, cause: BaseException, options: str | None = None) -> None:
        if isinstance(cause, TlsRefused):
            text = f"TLS failed: {cause} (see the options caFile, certFile, keyFile)"
        else:
            text = (
                f"refused the token: {cause} (see {options or f'the options authToken, authToken.{broker}'})"
            )
        super().__init__(f"timestone source: broker {broker!r} ({url}) {text}")
        self.broker = broker


@dataclass(frozen=True, slots=True)
class FetchSettings:
    """How to reach one broker and what to do on trouble; travels to executors inside each partition."""

    broker: str
    url: str
    auth_token: str | None = field(repr=False)
    timeout_ms: int
    retries: int
    retry_backoff_ms: int
    max_bytes: int
    fail_on_data_loss: bool
    token_option: str | None = None
    """The option that set ``auth_token``, for errors (None: ``authToken`` or ``authToken.<broker>``)."""
    sites: bool = False
    """The broker is an uplink hub: rows of ``$site/<site_id>/<topic>`` show the site and its topic."""
    store: str | None = None
    """The store the task's slices were planned on (``broker_stores``; None: not known, not checked)."""
    tls: ClientTls | None = None
    """The CAs (and client certificate) an ``https://`` broker is checked with (``caFile``, ``certFile``)."""

    def client(self) -> OffsetsClient:
        """A client retrying transient failures ``retries`` times, backing off exponentially."""
        return OffsetsClient(
            self.url,
            self.auth_token,
            timeout_s=self.timeout_ms / 1000,
            ssl_context=context_for(self.url, self.tls),
            retries=self.retries,
            retry_backoff_s=self.retry_backoff_ms / 1000,
        )

    def call(self, request: Callable[[], T]) -> T:
        """Run one client request, turning the client's errors into ones that name this broker."""
        began = time.monotonic()
        try:
            return request()
        except TlsRefused as error:
            raise BrokerAuthError(self.broker, self.url, error) from error
        except BrokerUnavailable as error:
            raise BrokerUnreachableError(self.broker, self.url, time.monotonic() - began, error) from error
        except AuthError as error:
            raise BrokerAuthError(self.broker, self.url, error, self.token_option) from error


@dataclass(slots=True)
class SliceProgress:
    """A slice being read: the next offset to fetch."""

    piece: Slice
    offset: int


def read_slices(fetch: FetchSettings, slices: Sequence[Slice]) -> Iterator[pa.RecordBatch]:
    """Yield exactly the records of ``slices`` (one broker's), as batches of SOURCE_ARROW_SCHEMA.

    All slices are fetched together (one request per round for a partition of many quiet topics), each
    round continuing every unfinished slice from its next offset and asking for no more than its rest.
    """
    pending = pending_slices(slices)
    lost = 0
    client = fetch.client()
    try:
        while pending:
            wanted = {topic: progress.offset for topic, progress in pending.items()}
            answer = fetch_round(fetch, client, pending, wanted)
            if not answer_store_matches(fetch.broker, fetch.store, answer.store, fetch.fail_on_data_loss):
                break
            taken = take_answer(fetch, pending, wanted, answer)
            lost += taken.lost
            if taken.rows == 0 and pending and not _moved(pending, wanted):
                raise RuntimeError(
                    f"timestone source: broker {fetch.broker!r} returned no records for "
                    f"{', '.join(f'{t} from {o}' for t, o in wanted.items())} although they were listed"
                )
            if taken.batch is not None:
                yield to_source_batch(taken.batch, fetch.broker, fetch.sites)
    finally:
        client.close()
    log_lost(lost, fetch.broker)


def pending_slices(slices: Sequence[Slice]) -> dict[str, SliceProgress]:
    """The progress of each non-empty slice, by topic (a task never holds two pieces of one topic)."""
    return {piece.topic: SliceProgress(piece, piece.start) for piece in slices if piece.end > piece.start}


def fetch_round(
    fetch: FetchSettings,
    client: OffsetsClient,
    pending: Mapping[str, SliceProgress],
    wanted: Mapping[str, int],
    wait_ms: int = 0,
) -> BatchFetch:
    """One ``POST /v1/fetch`` of ``wanted`` (topic -> next offset), each topic asking for its rest only."""
    rest = {t: min(MAX_RECORDS_PER_REQUEST, pending[t].piece.end - pending[t].offset) for t in wanted}
    return fetch.call(
        partial(
            client.fetch_many,
            dict(wanted),
            max(rest.values()),
            fetch.max_bytes,
            wait_ms,
            topic_max_records=rest,
        )
    )


@dataclass(slots=True)
class Taken:
    """What one fetch answer gave: its kept rows as one batch, how many rows it held, how many records were
    skipped as lost, and the topics a lagging replica could not serve yet (``lag_is_loss=False``)."""

    batch: pa.RecordBatch | None
    rows: int
    lost: int
    lagging: list[str]


def take_answer(
    fetch: FetchSettings,
    pending: dict[str, SliceProgress],
    wanted: Mapping[str, int],
    answer: BatchFetch,
    lag_is_loss: bool = True,
) -> Taken:
    """Advance ``pending`` by ``answer`` (to a fetch of ``wanted``), dropping finished slices.

    A log that ends before a slice's next offset (or is unknown) is data loss on a standalone broker; a
    cluster's replica may only be behind (``lag_is_loss=False``): those topics are returned as lagging, to
    be asked again or of another replica.
    """
    keep: list[tuple[int, int]] = []  # row ranges of the answer's table inside their slices
    lost = 0
    lagging: list[str] = []
    row = 0
    for topic in wanted:  # the answer holds each topic's records in request order
        result = answer.results.get(topic)
        progress = pending[topic]
        if result is None:
            raise RuntimeError(
                f"timestone source: broker {fetch.broker!r} answered nothing about topic {topic!r}"
            )
        if not lag_is_loss and _lagging(result, progress.offset):
            lagging.append(topic)
        elif result.error is not None:
            lost += _skip_lost(fetch, progress, result)
        elif result.records:
            take = min(result.records, progress.piece.end - progress.offset)
            keep.append((row, take))
            progress.offset += take
        elif result.end_offset is not None and result.end_offset <= progress.offset:
            lost += _skip_lost(fetch, progress, result)  # the log now ends before the planned range
        row += result.records
        if progress.offset >= progress.piece.end:
            del pending[topic]
    return Taken(_kept_rows(answer.table, keep, row), row, lost, lagging)


def _lagging(result: TopicResult, offset: int) -> bool:
    """Whether a replica's answer only shows it has not committed (or created) the log that far yet."""
    error = result.error
    if isinstance(error, UnknownTopicError):
        return True
    if isinstance(error, OffsetOutOfRangeError):
        return offset > error.end
    return (
        error is None and not result.records and result.end_offset is not None and result.end_offset <= offset
    )


def log_lost(lost: int, broker: str) -> None:
    if lost:
        log.warning(
            "timestone source: skipped %d records of broker %r that were removed while reading "
            "(failOnDataLoss=false)",
            lost,
            broker,
        )


def _moved(pending: dict[str, SliceProgress], wanted: dict[str, int]) -> bool:
    return any(progress.offset != wanted[topic] for topic, progress in pending.items())


def _kept_rows(table: pa.Table, keep: list[tuple[int, int]], rows: int) -> pa.RecordBatch | None:
    """One record batch of the kept row ranges (zero-copy when every row is kept)."""
    kept = sum(count for _, count in keep)
    if kept == 0:
        return None
    if kept == rows:
        return table.combine_chunks().to_batches()[0]
    indices = np.concatenate([np.arange(first, first + count) for first, count in keep])
    return table.take(pa.array(indices)).combine_chunks().to_batches()[0]


def _skip_lost(fetch: FetchSettings, progress: SliceProgress, result: TopicResult) -> int:
    """Continue a slice past records the broker no longer has; return how many were skipped.

    Raises DataLossError when failOnDataLoss; a new topic planned from an unknown log start just moves on.
    """
    piece, offset = progress.piece, progress.offset
    error = result.error
    log_start, log_end = result.start_offset, result.end_offset
    if isinstance(error, OffsetOutOfRangeError):
        log_start, log_end = error.start, error.end
        below_start = offset < error.start
        resume = min(error.start, piece.end) if below_start else piece.end  # else: the log was cut short
        if below_start and piece.from_log_start and offset == piece.start:
            progress.offset = resume  # a topic new to the query: its log simply starts later than guessed
            return 0
        why = "retention removed records not yet read" if below_start else "the log ends before this range"
    elif isinstance(error, CorruptRecordError):
        resume = min(error.next_offset, piece.end)
        why = (
            f"records [{offset}, {error.next_offset}) are missing on the broker (damaged, or a site lost "
            "them before its uplink sent them)"
        )
    elif isinstance(error, UnknownTopicError):
        resume = piece.end
        why = "the log no longer exists"
    elif error is None:
        resume = piece.end
        why = "the log ends before this range"
    else:
        raise RuntimeError(f"timestone source: broker {fetch.broker!r} topic {piece.topic!r}: {error}")
    if fetch.fail_on_data_loss:
        raise DataLossError(fetch.broker, piece.topic, offset, why, log_start, log_end)
    progress.offset = resume
    return resume - offset


def to_source_batch(batch: pa.RecordBatch, broker: str, sites: bool = False) -> pa.RecordBatch:
    """An offsets API record batch in the source's schema: a broker column first, cheap casts only. From a
    hub (``sites``), the broker column is each row's site and the topic the site's own."""
    broker_column: pa.Array = pa.repeat(broker, batch.num_rows)
    topic_column = None
    if sites:
        broker_column, topic_column = site_columns(batch.column("topic"))
    columns = [broker_column]
    for target in SOURCE_ARROW_SCHEMA:
        if target.name == "broker":
            continue
        column = (
            topic_column if target.name == "topic" and topic_column is not None else batch.column(target.name)
        )
        column = column if column.type == target.type else column.cast(target.type)
        columns.append(unique_keys(column) if target.name == "properties" else column)
    return pa.RecordBatch.from_arrays(columns, schema=SOURCE_ARROW_SCHEMA)


def unique_keys(column: pa.Array) -> pa.Array:
    """The ``properties`` map with each row's names once: MQTT 5 lets a publish repeat a user property's
    name, and a content type may sit beside a user property named ``content_type``, but Spark reads no
    Parquet map holding a key twice (``DUPLICATED_MAP_KEY``). A repeated name keeps its first place and its
    last value, as Spark's ``LAST_WIN`` does; a batch without one is returned as it is."""
    import numpy as np
    import pyarrow.compute as pc

    offsets = column.offsets.to_numpy()  # into the whole children, also for a slice
    lengths = np.diff(offsets)  # a map's entries per row (none for a null row)
    if len(lengths) == 0 or lengths.max() < 2:
        return column
    keys = column.keys.slice(offsets[0], offsets[-1] - offsets[0])
    values = column.items.slice(offsets[0], offsets[-1] - offsets[0])
    rows_of = np.repeat(np.arange(len(column)), lengths)
    found = pa.table({"row": rows_of, "key": keys, "at": np.arange(len(keys))})
    names = found.group_by(["row", "key"], use_threads=False).aggregate(
        [("at", "min"), ("at", "max"), ("at", "count")]
    )
    if pc.max(names.column("at_count")).as_py() == 1:
        return column
    first, last = names.column("at_min").to_numpy(), names.column("at_max").to_numpy()
    order = np.argsort(first)  # each row's names in the order they first came, the rows in theirs
    rows = names.column("row").to_numpy()[order]
    kept = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(column)))]).astype(np.int32)
    return pa.MapArray.from_arrays(
        pa.array(kept),
        keys.take(pa.array(first[order])),
        values.take(pa.array(last[order])),
        type=column.type,
        mask=column.is_null() if column.null_count else None,
    )


def site_columns(topics: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``$site/<site_id>/<topic>`` names split into the site ids and the sites' topics."""
    import pyarrow.compute as pc

    parts = pc.split_pattern(topics.cast(pa.string()), "/", max_splits=2)
    return pc.list_element(parts, 1), pc.list_element(parts, 2)
