"""The one client of the offsets API, for the Spark source, peer brokers and tests.

Synchronous on purpose (stdlib `http.client`, one kept-alive connection): it runs inside Spark executors
and other threads without an event loop. One client per thread. Transient failures (refused or dropped
connections, timeouts, 502/503/504) are retried with exponential backoff, then `BrokerUnavailable` is
raised; error answers become the typed errors of `broker_edge.offsets_api.errors`.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pyarrow as pa

from broker_edge.log_info import LogInfo
from broker_edge.offsets_api.results import (
    BatchFetch,
    Fetched,
    PartitionExtent,
    PartitionFetch,
    RemovedPositions,
    TopicResult,
)

from .arrow_format import read_arrow_stream
from .errors import (
    TLS_CLIENT_REFUSED,
    AuthError,
    BadRequestError,
    BrokerUnavailable,
    CorruptRecordError,
    ForbiddenError,
    OffsetOutOfRangeError,
    OffsetsApiError,
    PositionOutOfRangeError,
    TlsRefused,
    UnknownTopicError,
    error_from_body,
)
from .formats import (
    END_OFFSET_HEADER,
    NEXT_OFFSET_HEADER,
    PARTITION_METADATA_KEYS,
    RESULTS_METADATA_KEY,
    START_OFFSET_HEADER,
    STORE_HEADER,
    frames_records,
    topic_path_segment,
)

if TYPE_CHECKING:
    from broker_edge.storage.record import Record

__all__ = [
    "MAX_RETRY_WAIT_S",
    "AuthError",
    "BadRequestError",
    "BatchFetch",
    "BrokerUnavailable",
    "CorruptRecordError",
    "Fetched",
    "ForbiddenError",
    "LogInfo",
    "OffsetOutOfRangeError",
    "OffsetsApiError",
    "OffsetsClient",
    "PartitionExtent",
    "PartitionFetch",
    "PositionOutOfRangeError",
    "RemovedPositions",
    "TopicResult",
    "UnknownTopicError",
    "retry_wait_s",
]

Offset = int | Literal["earliest", "latest"]
T = TypeVar("T")
_RETRIED_STATUSES = frozenset({502, 503, 504})
_MAX_FRAME_BODY = 1 << 31


MAX_RETRY_WAIT_S = 30.0
"""The longest wait between two tries of a request, however many retries are allowed."""


def retry_wait_s(backoff_s: float, attempt: int) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): ``backoff_s``, doubled before each further one, at
    most ``MAX_RETRY_WAIT_S`` (or ``backoff_s`` itself where that is longer)."""
    doubled = backoff_s * 2 ** min(attempt - 1, 64)
    return min(doubled, max(backoff_s, MAX_RETRY_WAIT_S))


class OffsetsClient:
    """Blocking client of one broker's offsets API."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        retries: int = 3,
        retry_backoff_s: float = 0.1,
    ) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port], got {base_url!r}")
        self.base_url = base_url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        self.timeout_s = timeout_s
        self._ssl_context = ssl_context
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self._connection: http.client.HTTPConnection | None = None
        self.store: str | None = None
        """The identity of the broker's store its last answer told (``STORE_HEADER``; None: an older
        broker, or no answer yet). Offsets of one store mean nothing in another."""

    def __enter__(self) -> OffsetsClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the kept-alive connection (the client reconnects if used again)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # -- endpoints -----------------------------------------------------------------------------------

    def list_logs(self, pattern: str | None = None) -> list[LogInfo]:
        """Every log of the broker, or those whose topic matches the MQTT filter `pattern`."""
        query = {"pattern": pattern} if pattern is not None else {}
        body = self._json("GET", "/v1/logs", query)
        return [_log_info(item) for item in body["logs"]]

    def log_info(self, topic: str) -> LogInfo:
        """Bounds and size of one log."""
        return _log_info(self._json("GET", f"/v1/logs/{topic_path_segment(topic)}", {}))

    def offset_for_timestamp(self, topic: str, timestamp_ms: int | Literal["earliest", "latest"]) -> int:
        """First offset of `topic` appended at or after `timestamp_ms` (the end offset if none)."""
        path = f"/v1/logs/{topic_path_segment(topic)}/offset"
        return int(self._json("GET", path, {"timestamp_ms": timestamp_ms})["offset"])

    def cluster(self) -> dict[str, Any]:
        """The answering member's picture of its cluster (`GET /v1/cluster`, a JSON object that
        `cluster_client.parse_layout` reads); a standalone broker answers 404."""
        return self._json("GET", "/v1/cluster", {})

    def fetch(
        self, topic: str, offset: Offset, max_records: int = 1000, max_bytes: int = 1 << 20, wait_ms: int = 0
    ) -> Fetched[pa.Table]:
        """Records of `topic` from `offset` as an Arrow table; waits up to `wait_ms` when there are none."""
        data, headers = self._records(topic, offset, max_records, max_bytes, wait_ms, "arrow")
        return _fetched(read_arrow_stream(data), headers)

    def fetch_arrow(
        self, topic: str, offset: Offset, max_records: int = 1000, max_bytes: int = 1 << 20, wait_ms: int = 0
    ) -> pa.Table:
        """Like `fetch`, the table only (its schema metadata carries the next/start/end offsets)."""
        return self.fetch(topic, offset, max_records, max_bytes, wait_ms).data

    def fetch_records(
        self, topic: str, offset: Offset, max_records: int = 1000, max_bytes: int = 1 << 20, wait_ms: int = 0
    ) -> Fetched[list[Record]]:
        """Records as stored (raw frames, checksums verified here again): lossless, for peer brokers."""
        data, headers = self._records(topic, offset, max_records, max_bytes, wait_ms, "frames")
        records, refused = frames_records(data, headers, _MAX_FRAME_BODY)
        if refused is not None:
            raise OffsetsApiError(200, "bad_frames", f"damaged frames from the broker: {refused}")
        return _fetched(records, headers)

    def fetch_many(
        self,
        offsets: Mapping[str, Offset],
        max_records: int = 1000,
        max_bytes: int = 4 << 20,
        wait_ms: int = 0,
        pattern: str | None = None,
        topic_max_records: Mapping[str, int] | None = None,
    ) -> BatchFetch:
        """Records of many topics in one round trip, within a shared byte budget.

        `max_records` bounds each topic, unless `topic_max_records` gives that topic its own bound (a
        reader that needs exactly the rest of a range). Waits up to `wait_ms` when no topic has records
        (and, with `pattern`, wakes when a new log matching it appears). Per-topic errors are reported in
        the results, not raised.
        """
        limits = topic_max_records or {}
        fetches: list[dict[str, str | int]] = []
        for topic, offset in offsets.items():
            fetch: dict[str, str | int] = {"topic": topic, "offset": offset}
            if topic in limits:
                fetch["max_records"] = limits[topic]
            fetches.append(fetch)
        body: dict = {
            "fetches": fetches,
            "max_records": max_records,
            "max_bytes": max_bytes,
            "wait_ms": wait_ms,
            "format": "arrow",
        }
        if pattern is not None:
            body["pattern"] = pattern
        status, _, data = self._request("POST", "/v1/fetch", {}, json.dumps(body).encode(), wait_ms)
        self._raise_for(status, data)
        table = read_arrow_stream(data)
        raw_results = json.loads((table.schema.metadata or {})[RESULTS_METADATA_KEY])
        results = {topic: _topic_result(topic, item) for topic, item in raw_results.items()}
        return BatchFetch(table, results, self.store)

    def partitions(self) -> list[PartitionExtent]:
        """The broker's storage partitions and their extents in positions (`NotFound`-coded
        `OffsetsApiError` from a cluster's member or a broker without partition reads)."""
        body = self._json("GET", "/v1/partitions", {})
        return [
            PartitionExtent(item["partition"], item["start_position"], item["end_position"])
            for item in body["partitions"]
        ]

    def position_for_timestamp(self, partition: int, timestamp_ms: int) -> int:
        """The position of the partition's first record appended at or after `timestamp_ms`."""
        path = f"/v1/partitions/{partition}/position"
        return int(self._json("GET", path, {"timestamp_ms": timestamp_ms})["position"])

    def read_partition(
        self,
        partition: int,
        position: int,
        max_entries: int = 100_000,
        max_bytes: int = 4 << 20,
        patterns: Sequence[str] = (),
    ) -> PartitionFetch:
        """Records of the partition's topics matching `patterns` (every topic when empty) among its entries
        from `position`, in log order (raises `PositionOutOfRangeError`)."""
        query: list[tuple[str, object]] = [
            ("position", position),
            ("max_entries", max_entries),
            ("max_bytes", max_bytes),
            *(("pattern", pattern) for pattern in patterns),
        ]
        status, _, data = self._request("GET", f"/v1/partitions/{partition}/records", query, None, 0)
        self._raise_for(status, data)
        table = read_arrow_stream(data)
        metadata = table.schema.metadata or {}
        value = {key: metadata[name] for key, name in PARTITION_METADATA_KEYS.items()}
        return PartitionFetch(
            table,
            int(value["next_position"]),
            int(value["start_position"]),
            int(value["end_position"]),
            json.loads(value["lost"]),
            int(value["damaged"]),
            int(value["removed"]),
            self.store,
        )

    def removed_since(self, partition: int, since: int, patterns: Sequence[str] = ()) -> RemovedPositions:
        """The topics matching `patterns` (every topic when empty) whose records retention deleted with
        their segments at or past position `since`, and where the broker's account of them begins
        (`NotFound`-coded `OffsetsApiError` from a broker older than the account)."""
        query: list[tuple[str, object]] = [("since", since), *(("pattern", pattern) for pattern in patterns)]
        status, _, data = self._request("GET", f"/v1/partitions/{partition}/removed", query, None, 0)
        self._raise_for(status, data)
        body = json.loads(data)
        return RemovedPositions(int(body["accounted_from"]), dict(body["removed_below"]))

    # -- transport -----------------------------------------------------------------------------------

    def _records(
        self, topic: str, offset: Offset, max_records: int, max_bytes: int, wait_ms: int, output: str
    ) -> tuple[bytes, http.client.HTTPMessage]:
        query = {
            "offset": offset,
            "max_records": max_records,
            "max_bytes": max_bytes,
            "wait_ms": wait_ms,
            "format": output,
        }
        path = f"/v1/logs/{topic_path_segment(topic)}/records"
        status, headers, data = self._request("GET", path, query, None, wait_ms)
        self._raise_for(status, data)
        return data, headers

    def _json(self, method: str, path: str, query: Mapping[str, object]) -> dict:
        status, _, data = self._request(method, path, query, None, 0)
        self._raise_for(status, data)
        return json.loads(data)

    @staticmethod
    def _raise_for(status: int, data: bytes) -> None:
        if status < 400:
            return
        try:
            body = json.loads(data)
        except ValueError:
            body = {"error": "http_error", "message": data[:200].decode("utf-8", "replace")}
        raise error_from_body(status, body)

    def _request(
        self,
        method: str,
        path: str,
        query: Mapping[str, object] | Sequence[tuple[str, object]],
        body: bytes | None,
        wait_ms: int,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        target = self._prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        last_error: BaseException | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(retry_wait_s(self.retry_backoff_s, attempt))
            try:
                connection = self._connect(self.timeout_s + wait_ms / 1000)
                connection.request(method, target, body, headers)
                response = connection.getresponse()
                data = response.read()
            except ssl.SSLCertVerificationError as error:
                self.close()
                raise TlsRefused(f"{self.base_url}: TLS verification failed: {error}") from error
            except ssl.SSLError as error:
                self.close()
                if error.reason in TLS_CLIENT_REFUSED:
                    raise TlsRefused(
                        f"{self.base_url}: the broker refused this client's certificate: {error}"
                    ) from error
                last_error = error
                continue
            except (OSError, http.client.HTTPException) as error:
                self.close()
                last_error = error
                continue
            self.store = response.headers.get(STORE_HEADER)
            if response.status in _RETRIED_STATUSES:
                last_error = OffsetsApiError(
                    response.status, "unavailable", data[:200].decode("utf-8", "replace")
                )
                continue
            return response.status, response.headers, data
        raise BrokerUnavailable(
            f"{self.base_url}: {method} {path} failed after {self.retries + 1} attempts"
        ) from (last_error)

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        connection = self._connection
        if connection is None:
            if self._https:
                connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout_s, context=self._ssl_context
                )
            else:
                connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
            self._connection = connection
        connection.timeout = timeout_s
        if connection.sock is not None:
            connection.sock.settimeout(timeout_s)
        return connection


def _log_info(item: Mapping) -> LogInfo:
    return LogInfo(
        item["topic"], item["start_offset"], item["end_offset"], item["bytes"], item["last_append_ms"]
    )


def _fetched(data: T, headers: http.client.HTTPMessage) -> Fetched[T]:
    return Fetched(
        data,
        int(headers[NEXT_OFFSET_HEADER]),
        int(headers[START_OFFSET_HEADER]),
        int(headers[END_OFFSET_HEADER]),
    )


def _topic_result(topic: str, item: dict[str, Any]) -> TopicResult:
    error = error_from_body(item["status"], item) if "error" in item else None
    return TopicResult(
        topic,
        item.get("next_offset"),
        item.get("start_offset"),
        item.get("end_offset"),
        item.get("records", 0),
        error,
    )
