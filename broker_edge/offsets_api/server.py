"""The offsets API: read a broker's logs over HTTP by (topic, offset), as Arrow IPC, JSON lines or raw frames.

Endpoints (see docs/offsets-api.md for examples):

    GET  /v1/logs?pattern=<filter>                      list logs
    GET  /v1/logs/{topic}                               one log's bounds
    GET  /v1/logs/{topic}/records?offset=&max_records=&max_bytes=&wait_ms=&format=
    GET  /v1/logs/{topic}/offset?timestamp_ms=          offset for a broker time
    POST /v1/fetch                                      many topics in one request
    GET  /v1/partitions[/{p}/position|/{p}/records]     every topic of a storage partition by position
    POST /v1/replica/fetch                              a cluster's followers (added by the cluster node)
    GET  /v1/cluster                                    a cluster's members and leaders (cluster node)

`{topic}` is one path segment: `/` inside a topic is sent as `%2F`. Offsets may be a number, `earliest` or
`latest`. Only durable records are ever served. Errors are JSON `{"error": code, "message": ...}`.

Every request is admitted by the app's authenticator first (``Access``, see ``access``): a reader's token
and the topics it may read, or a member's proven node id on the members' endpoint. A request it does not
admit is answered 401 and its connection closed at once. Handlers check the topics they list or read
against the access, and hold their share of the broker's HTTP memory budget before reading
(``http_guard.hold``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from aiohttp import HttpVersion11, web

from broker_edge.bounds import MAX_OFFSET
from broker_edge.http.guard import (
    GuardedRunner,
    Pace,
    UnreadBody,
    hold,
    mark_authenticated,
    over_budget_response,
    read_body,
    reads_of,
    settle,
    start_guarded_site,
    waiting,
)
from broker_edge.http.json_errors import client_gone, http_error_answer
from broker_edge.http.read_gate import ReadGate, work_in_thread, work_turn
from broker_edge.observe.refusal_log import LogSummary
from broker_edge.security.access import EVERYONE, Access
from broker_edge.security.http_budget import BudgetExhausted, MemoryBudget
from broker_edge.security.reader_tokens import ReaderToken, ReaderTokens
from broker_edge.storage import (
    CorruptRecord,
    LogInfo,
    LogStore,
    OffsetOutOfRange,
    Record,
    UnknownTopic,
)

from . import errors as codes
from .formats import (
    END_OFFSET_HEADER,
    FORMATS,
    NEXT_OFFSET_HEADER,
    POSITION_METADATA_KEYS,
    RECORD_COUNT_HEADER,
    RESULTS_METADATA_KEY,
    START_OFFSET_HEADER,
    STORE_HEADER,
    frames_body,
    jsonl_body,
    jsonl_record,
)
from .requests import (
    ACCESS,
    ANSWER_OVERHEAD,
    MAX_JSON_BODY,
    ApiError,
    ApiLimits,
    access_of,
    check_body_length,
    check_escapes,
    expect_handler,
    format_param,
    int_param,
    is_number,
    json_body,
    pattern_param,
)

if TYPE_CHECKING:
    from broker_edge.storage.frame_runs import FrameRun

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Authenticator = Callable[[web.Request], Access]
"""Admits a request (its ``Access``) or raises ``ApiError`` (401, or 403 with ``close``)."""
log = logging.getLogger(__name__)

LIST_CHUNK = 1024
"""Logs listed in one piece of work (about 4 ms of CPU: their `LogInfo`s, JSON and write), each waiting for
its turn of the loop (``read_gate.work_turn``)."""
SLICE_S = 0.002
"""Work a multi-topic fetch, or a read of many records, does between two yields to the event loop."""
READ_SLICE = 256
"""Records read at a time (``read_in_slices``): a few milliseconds of CPU at most, their checks mostly."""
INLINE_RECORDS = 1024
"""Answers of more records are built in a thread of the loop's executor (100,000 records' JSON lines took
the loop for most of a second)."""


def forbidden(topic: str, access: Access) -> ApiError:
    """The error for a topic ``access`` may not read (it says nothing of whether the topic exists)."""
    return ApiError(403, codes.FORBIDDEN, f"{access.name} may not read {topic!r}", topic=topic)


def api_error_for(error: Exception) -> ApiError | None:
    """The API error for a storage error (None for anything else)."""
    if isinstance(error, UnknownTopic):
        return ApiError(404, codes.UNKNOWN_TOPIC, str(error), topic=error.topic)
    if isinstance(error, OffsetOutOfRange):
        return ApiError(
            416,
            codes.OFFSET_OUT_OF_RANGE,
            str(error),
            topic=error.topic,
            offset=error.offset,
            start_offset=error.start,
            end_offset=error.end,
        )
    if isinstance(error, CorruptRecord):
        return ApiError(
            500,
            codes.CORRUPT_RECORD,
            str(error),
            topic=error.topic,
            offset=error.offset,
            next_offset=error.next_offset,
        )
    return None


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as JSON, whether raised by a handler, the storage or the router."""
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()
    except BudgetExhausted:
        return over_budget_response()
    except UnreadBody as error:  # (to a client that closed its connection, it goes nowhere)
        return ApiError(
            error.status, codes.BAD_REQUEST, error.message, close=True, parameter="body"
        ).response()
    except (UnknownTopic, OffsetOutOfRange, CorruptRecord) as error:
        api_error = api_error_for(error)
        assert api_error is not None
        return api_error.response()
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return http_error_answer(error)
    except Exception as error:
        if isinstance(error, OSError) and not isinstance(error, ConnectionError):
            return unreadable_answer(request, error)
        if client_gone(request, error):  # nothing to answer: the server's handler says so quietly
            raise
        log.exception("offsets API request failed: %s %s", request.method, request.path)
        return ApiError(500, "internal_error", "the request failed inside the broker").response()


_said_unreadable = LogSummary(log, interval_s=60.0)
"""Storage that cannot be read, said once a minute: every reader's retry meets it again."""


def unreadable_answer(request: web.Request, error: OSError) -> web.Response:
    """A log's file the broker cannot read (its owner or mode wrong, EIO): 503 ``log_unreadable`` with
    ``Retry-After`` (it may be put right while the broker runs), said at ERROR naming the file."""
    _said_unreadable.log(
        logging.ERROR,
        "unreadable",
        "offsets API: cannot read %s (%s): readers of it are answered 503 until it can be read",
        error.filename or "a log's file",
        error.strerror or error,
    )
    topic = request.match_info.get("topic")
    named: dict[str, Any] = {"topic": topic} if topic else {}
    whose = f"{topic!r}'s log" if topic else "a log it holds"
    answer = ApiError(503, codes.LOG_UNREADABLE, f"the broker cannot read {whose} now", **named).response()
    answer.headers["Retry-After"] = "1"
    return answer


REPEATABLE_PARAMETERS = frozenset(
    {("/v1/partitions/{partition}/records", "pattern"), ("/v1/partitions/{partition}/removed", "pattern")}
)
"""The (path, query parameter) a request may give more than once: each ``pattern`` of a partition's read
is one more filter."""


@web.middleware
async def one_value_each(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A parameter given twice (``?offset=5&offset=9``) is refused: one of the two would be read and the
    other silently dropped, whichever the reader meant. So is a target whose escapes are malformed
    (``check_escapes``)."""
    check_escapes(request.raw_path)
    resource = request.match_info.route.resource
    path = resource.canonical if resource is not None else ""
    for name in request.query:
        if (path, name) not in REPEATABLE_PARAMETERS and len(request.query.getall(name)) > 1:
            count = len(request.query.getall(name))
            raise ApiError(400, codes.BAD_REQUEST, f"{name} is given {count} times; give it once")
    return await handler(request)


def reader_authenticator(tokens: ReaderTokens | None) -> Authenticator:
    """Admits readers by their bearer token (``tokens``); without tokens, everyone reads everything."""

    def authenticate(request: web.Request) -> Access:
        if tokens is None:
            return EVERYONE
        given = request.headers.getall("Authorization", ())
        if len(given) > 1:  # (one field, RFC 9110 5.3: which of them a proxy read is anyone's guess)
            message = f"Authorization is given {len(given)} times; give it once"
            raise ApiError(400, codes.BAD_REQUEST, message, close=True)
        access = tokens.access(request.headers.get("Authorization"))
        if access is None:
            raise ApiError(401, codes.UNAUTHORIZED, "missing or invalid bearer token")
        return access

    return authenticate


def authentication(
    authenticate: Authenticator,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """A middleware admitting each request with ``authenticate`` before its handler runs."""

    @web.middleware
    async def admitted(request: web.Request, handler: Handler) -> web.StreamResponse:
        access = authenticate(request)
        request[ACCESS] = access
        if access is not EVERYONE:
            refusal = mark_authenticated(request, access.name)
            if refusal is not None:  # its reader holds its share of the connections
                return refusal
        return await handler(request)

    return admitted


def is_member(request: web.Request) -> bool:
    """Whether ``request`` came from a member that proved its node id (it may use the members' share of
    the memory budget)."""
    return access_of(request).member is not None


def create_app(
    store: LogStore,
    token: str | None = None,
    limits: ApiLimits | None = None,
    routes: Sequence[Callable[[web.Application], None]] = (),
    authenticate: Authenticator | None = None,
) -> web.Application:
    """The offsets API over `store`. Requests are admitted by `authenticate` (a broker's readers' tokens,
    or a cluster's members); without it, by `token` (one reader token for every topic) when given, else
    everyone reads everything.

    Each of `routes` adds more endpoints behind the same authentication (``GET /v1/cluster``)."""
    if authenticate is None:
        tokens = ReaderTokens([ReaderToken("token", token)]) if token is not None else None
        authenticate = reader_authenticator(tokens)
    middlewares: list = [json_errors, authentication(authenticate), one_value_each]
    app = web.Application(middlewares=middlewares)
    app.on_response_prepare.append(_store_header(store))
    handlers = _Handlers(store, limits or ApiLimits())
    app.on_shutdown.append(handlers.stop_waiting)
    expect = expect_handler(authenticate)
    app.router.add_get("/v1/logs", handlers.list_logs, expect_handler=expect)
    app.router.add_get("/v1/logs/{topic}", handlers.log_info, expect_handler=expect)
    app.router.add_get("/v1/logs/{topic}/records", handlers.records, expect_handler=expect)
    app.router.add_get("/v1/logs/{topic}/offset", handlers.offset_for_timestamp, expect_handler=expect)
    app.router.add_post("/v1/fetch", handlers.fetch_many, expect_handler=expect)
    from .partitions import add_partition_routes  # (it builds on this module's helpers)

    add_partition_routes(app, store, handlers.limits, expect)
    app.router.add_get("/v1/logs/{rest:.+}", _unescaped_topic, expect_handler=expect)
    for add_routes in routes:
        add_routes(app)
    return app


def _store_header(store: LogStore) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """Adds the store's identity (``STORE_HEADER``) to every answer, errors and streamed ones included."""

    async def add(_request: web.Request, response: web.StreamResponse) -> None:
        if store.store_id is not None:
            response.headers[STORE_HEADER] = store.store_id

    return add


async def serve(
    store: LogStore,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    limits: ApiLimits | None = None,
) -> tuple[GuardedRunner, int]:
    """Serve the API over `store` on host/port (0 picks a free port); returns the runner and bound port.

    `await runner.cleanup()` stops it. TLS when `ssl_context` is given, bearer auth when `token` is.
    """
    return await serve_app(create_app(store, token, limits), host, port, ssl_context, limits)


async def serve_app(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    limits: ApiLimits | None = None,
    budget: MemoryBudget | None = None,
) -> tuple[GuardedRunner, int]:
    """Bind an already built app (see `serve`), behind a cap on connections and request time limits, and
    within `budget` when given."""
    limits = limits or ApiLimits()
    runner = await start_guarded_site(
        app,
        host,
        port,
        ssl_context,
        limits.max_connections,
        limits.request_timeout_s,
        budget=budget,
        is_member=is_member,
        send_timeout_s=limits.send_timeout_s,
        max_line_size=limits.max_request_line,
        min_read_bytes_per_s=limits.min_read_bytes_per_s,
        max_per_reader=limits.max_connections_per_reader,
    )
    return runner, runner.port


# -- request parsing ---------------------------------------------------------------------------------


def _resolve_offset(value: object, info: LogInfo | None) -> int:
    """A numeric offset, or `earliest` / `latest` resolved against the log (0 for a log not there yet)."""
    if value == "earliest":
        return info.start_offset if info else 0
    if value == "latest":
        return info.end_offset if info else 0
    if value is None:
        raise ApiError(
            400, codes.BAD_OFFSET, "offset is required (a number, 'earliest' or 'latest')", parameter="offset"
        )
    if not is_number(value) or int(str(value)) < 0:
        shown = value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "..."
        raise ApiError(
            400,
            codes.BAD_OFFSET,
            f"offset must be a number, 'earliest' or 'latest', got {shown!r}",
            parameter="offset",
        )
    offset = int(str(value))
    if offset > MAX_OFFSET:
        raise ApiError(
            400,
            codes.BAD_OFFSET,
            f"offset must be within [0, {MAX_OFFSET}] (what a log holds), got {offset}",
            parameter="offset",
        )
    return offset


def _arrow_body(
    topic_runs: Sequence[tuple[str, Sequence[Any]]], metadata: Mapping[bytes, bytes]
) -> memoryview:
    """An Arrow IPC stream of the records of `topic_runs` (`FrameRun`s); the first one loads pyarrow."""
    from .arrow_format import arrow_stream
    from .arrow_runs import arrow_batch_of_runs

    return memoryview(arrow_stream(arrow_batch_of_runs(topic_runs), metadata))


def _info_json(info: LogInfo) -> dict[str, Any]:
    return {
        "topic": info.topic,
        "start_offset": info.start_offset,
        "end_offset": info.end_offset,
        "bytes": info.bytes,
        "last_append_ms": info.last_append_ms,
    }


@dataclass(slots=True)
class _Fetch:
    topic: str
    offset: object
    max_records: int


class _Handlers:
    """The endpoint handlers over one store."""

    def __init__(self, store: LogStore, limits: ApiLimits) -> None:
        self.store = store
        self.limits = limits
        self.stopping = asyncio.Event()
        """Set when the app shuts down: long polls answer at once with what there is."""

    async def stop_waiting(self, _app: web.Application) -> None:
        """End every long poll (``on_shutdown``, before the runner waits for the requests in progress):
        a stop must not wait for their ``wait_ms``."""
        self.stopping.set()

    async def _wait_for_data(
        self,
        request: web.Request,
        positions: Mapping[str, int],
        wait_ms: int,
        pattern: str | None = None,
    ) -> None:
        """``LogStore.wait_for_data``, cut short when the app shuts down, or when the connection gives way
        to a new one at the connection cap (``http.guard.waiting``)."""
        if self.stopping.is_set():
            return
        with waiting(request) as give_way:
            waits = [
                asyncio.ensure_future(self.store.wait_for_data(positions, wait_ms / 1000, pattern)),
                asyncio.ensure_future(self.stopping.wait()),
                asyncio.ensure_future(give_way.wait()),
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    def _share(self, topics: Sequence[str], max_bytes: int) -> int:
        """What a read of ``topics`` within ``max_bytes`` may hold, answer included: ``max_bytes``, or less
        when the logs are smaller (a device's topic holds kilobytes; its fetch need not hold megabytes)."""
        stored = 0
        for topic in topics:
            info = self._info(topic)
            stored += info.bytes if info is not None else 0
            if stored >= max_bytes:
                return max_bytes
        return min(max_bytes, 2 * stored + ANSWER_OVERHEAD)

    def _info(self, topic: str) -> LogInfo | None:
        return self.store.log_info(topic) if topic in self.store else None

    async def list_logs(self, request: web.Request) -> web.StreamResponse:
        """Every log matching `pattern`, listed and sent a chunk at a time, the loop served between chunks.

        A listing of 300,000 logs built whole held the loop for a second; built by chunks but joined and
        sent as one body (12 MB at 100,000 logs), it still held it for 30 ms at the end. So each chunk's JSON
        is written as it is made (chunked transfer encoding) and nothing holds the whole answer."""
        chunks = self.store.iter_logs(pattern_param(request.query.get("pattern")), LIST_CHUNK)
        first = next(chunks)
        access = access_of(request)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if request.method == "HEAD":  # GET's headers and no body (one written here would follow them)
            return response
        if request.version >= HttpVersion11:  # HTTP/1.0 has no chunks: its body ends with the connection
            response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            listed = itertools.chain([first], chunks)
            await self._write_listing(Pace(request), response, listed, access, reads_of(request))
        except ConnectionError:  # (the answer's status is sent: nothing else can be told)
            log.debug("%s closed its connection in the middle of a listing", request.remote)
        return response

    async def _write_listing(
        self,
        pace: Pace,
        response: web.StreamResponse,
        chunks: Iterator[list[LogInfo]],
        access: Access,
        gate: ReadGate | None,
    ) -> None:
        """The listing's body, a chunk of logs per write, each in a turn of the loop of its own
        (``work_turn`` on ``gate``, the request's socket: seventy listings at once each took a chunk of a few
        milliseconds in every turn), taken at ``min_read_bytes_per_s`` at least (``http.guard.Pace``)."""
        replicated = self.store.replicated_log.enabled
        await pace.write(response, b'{"logs": [')
        separator = b""
        for chunk in chunks:
            listed = [_info_json(info) for info in chunk if access.may_read(info.topic)]
            if replicated:  # a cluster's controller elects the in-sync replica holding the most
                for item in listed:
                    item["durable_end_offset"] = self.store.durable_end(item["topic"])
            if listed:
                await pace.write(response, separator + json.dumps(listed)[1:-1].encode())
                separator = b", "
            await work_turn(gate)
        await pace.write(response, b"]}")
        await response.write_eof()

    async def log_info(self, request: web.Request) -> web.Response:
        return web.json_response(_info_json(self.store.log_info(_readable_topic(request))))

    async def offset_for_timestamp(self, request: web.Request) -> web.Response:
        topic = _readable_topic(request)
        value = request.query.get("timestamp_ms")
        info = self.store.log_info(topic)
        timestamp: int | str
        if value in ("earliest", "latest"):
            timestamp = value
            offset = info.start_offset if value == "earliest" else info.end_offset
        else:
            if value is None:
                raise ApiError(
                    400, codes.BAD_REQUEST, "timestamp_ms is required (milliseconds since the epoch)"
                )
            timestamp = int_param(value, "timestamp_ms", 0, 0, 2**63 - 1)
            offset = self.store.offset_for_timestamp(topic, timestamp)
        return web.json_response({"topic": topic, "timestamp_ms": timestamp, "offset": offset})

    async def records(self, request: web.Request) -> web.Response:
        topic = _readable_topic(request)
        query = request.query
        limits = self.limits
        output = format_param(query.get("format"))
        max_records = int_param(
            query.get("max_records"), "max_records", limits.default_records, 1, limits.max_records
        )
        max_bytes = int_param(query.get("max_bytes"), "max_bytes", limits.default_bytes, 1, limits.max_bytes)
        wait_ms = int_param(query.get("wait_ms"), "wait_ms", 0, 0, limits.max_wait_ms)
        offset = _resolve_offset(query.get("offset"), self.store.log_info(topic))
        read = self.store.read_runs if output == "arrow" else self.store.read
        share = self._share([topic], max_bytes)
        hold(request, share)  # what the read and the answer built from it may hold
        gate = reads_of(request)
        records = await read_in_slices(read, topic, offset, max_records, max_bytes, gate)
        if not records and wait_ms:
            settle(request, 0)  # nothing is held while it waits
            await self._wait_for_data(request, {topic: offset}, wait_ms)
            hold(request, self._share([topic], max_bytes))
            records = await read_in_slices(read, topic, offset, max_records, max_bytes, gate)
        info = self.store.log_info(topic)
        count, next_offset = _count_and_next(records, offset)
        positions = {
            "next_offset": next_offset,
            "start_offset": info.start_offset,
            "end_offset": info.end_offset,
        }
        headers = {
            NEXT_OFFSET_HEADER: str(next_offset),
            START_OFFSET_HEADER: str(info.start_offset),
            END_OFFSET_HEADER: str(info.end_offset),
            RECORD_COUNT_HEADER: str(count),
        }
        metadata = {POSITION_METADATA_KEYS[key]: str(value).encode() for key, value in positions.items()}
        body = await _built(gate, count, _records_body, output, topic, records, metadata)
        return web.Response(body=body, headers=headers, content_type=FORMATS[output])

    async def fetch_many(self, request: web.Request) -> web.Response:
        fetches, max_bytes, wait_ms, output, pattern = self._parse_fetch(await self._json_body(request))
        columnar = output == "arrow"
        access = access_of(request)
        topics = [fetch.topic for fetch in fetches]
        settle(request, 0)
        hold(request, self._share(topics, max_bytes))
        gate = reads_of(request)
        chunks, results, positions = await self._fetch_round(fetches, max_bytes, columnar, access, gate)
        if not chunks and wait_ms:
            settle(request, 0)
            await self._wait_for_data(request, positions, wait_ms, pattern)
            hold(request, self._share(topics, max_bytes))
            chunks, results, _ = await self._fetch_round(fetches, max_bytes, columnar, access, gate)
        if columnar:
            metadata = {RESULTS_METADATA_KEY: json.dumps(results).encode()}
            # built in a thread (the runs hold immutable bytes): 10,000 topics' rows are many milliseconds;
            # one answer at a time, as a piece of the loop's HTTP work (``read_gate.work_in_thread``)
            body: Any = await work_in_thread(gate, _arrow_body, chunks, metadata)
        else:
            count = sum(result.get("records", 0) for result in results.values())
            body = await _built(gate, count, _batch_lines, results, chunks)
        return web.Response(body=body, content_type=FORMATS[output])

    async def _json_body(self, request: web.Request) -> dict:
        check_body_length(request)
        hold(request, min(request.content_length or MAX_JSON_BODY, MAX_JSON_BODY))
        return json_body(await read_body(request, self.limits.request_timeout_s))

    def _parse_fetch(self, body: dict) -> tuple[list[_Fetch], int, int, str, str | None]:
        limits = self.limits
        items = body.get("fetches")
        if not isinstance(items, list) or not items or len(items) > limits.max_fetches:
            raise ApiError(
                400, codes.BAD_REQUEST, f"fetches must be a list of 1 to {limits.max_fetches} objects"
            )
        default_records = int_param(
            body.get("max_records"), "max_records", limits.default_records, 1, limits.max_records
        )
        fetches: list[_Fetch] = []
        seen: set[str] = set()
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("topic"), str) or not item["topic"]:
                raise ApiError(400, codes.BAD_REQUEST, "each fetch needs a non-empty string topic")
            max_records = int_param(
                item.get("max_records"), "max_records", default_records, 1, limits.max_records
            )
            _resolve_offset(item.get("offset"), None)  # validates the form before anything is read
            if item["topic"] in seen:
                raise ApiError(400, codes.BAD_REQUEST, f"topic {item['topic']!r} is fetched twice")
            seen.add(item["topic"])
            fetches.append(_Fetch(item["topic"], item["offset"], max_records))
        max_bytes = int_param(
            body.get("max_bytes"), "max_bytes", limits.default_batch_bytes, 1, limits.max_bytes
        )
        wait_ms = int_param(body.get("wait_ms"), "wait_ms", 0, 0, limits.max_wait_ms)
        output = format_param(body.get("format"), {name: FORMATS[name] for name in ("arrow", "jsonl")})
        return fetches, max_bytes, wait_ms, output, pattern_param(body.get("pattern"))

    async def _fetch_round(
        self,
        fetches: list[_Fetch],
        max_bytes: int,
        columnar: bool,
        access: Access = EVERYONE,
        gate: ReadGate | None = None,
    ) -> tuple[list[tuple[str, list[Any]]], dict[str, dict[str, Any]], dict[str, int]]:
        """Read every fetch within a shared byte budget; only the first non-empty topic may exceed it.

        Returns the records per topic (`Record`s, or `FrameRun`s when `columnar`), the per-topic results,
        and the offset each topic was read from. Waits for a turn of the loop (``work_turn`` on ``gate``, the
        request's socket) after every `SLICE_S` of work, so that a fetch of 10,000 topics never holds MQTT
        up for long.
        """
        chunks: list[tuple[str, list[Any]]] = []
        results: dict[str, dict[str, Any]] = {}
        positions: dict[str, int] = {}
        budget = max_bytes
        read = self.store.read_runs if columnar else self.store.read
        slice_end = time.monotonic() + SLICE_S
        for number, fetch in enumerate(fetches):
            if number % 64 == 63 and time.monotonic() >= slice_end:
                await work_turn(gate)
                slice_end = time.monotonic() + SLICE_S
            if not access.may_read(fetch.topic):
                refusal = forbidden(fetch.topic, access)
                results[fetch.topic] = {
                    "error": refusal.code,
                    "status": refusal.status,
                    "message": refusal.message,
                    **refusal.extra,
                }
                continue
            info = self._info(fetch.topic)
            offset = positions[fetch.topic] = _resolve_offset(fetch.offset, info)
            try:
                records = (
                    await read_in_slices(read, fetch.topic, offset, fetch.max_records, budget, gate)
                    if budget > 0
                    else []
                )
            except (UnknownTopic, OffsetOutOfRange, CorruptRecord) as error:
                api_error = api_error_for(error)
                assert api_error is not None
                results[fetch.topic] = {
                    "error": api_error.code,
                    "status": api_error.status,
                    "message": api_error.message,
                    **api_error.extra,
                }
                continue
            size = sum(item.size for item in records)
            if chunks and size > budget:
                records = []
            if records:
                chunks.append((fetch.topic, records))
                budget -= size
            assert info is not None
            count, next_offset = _count_and_next(records, offset)
            results[fetch.topic] = {
                "next_offset": next_offset,
                "start_offset": info.start_offset,
                "end_offset": info.end_offset,
                "records": count,
            }
        return chunks, results, positions


async def read_in_slices(
    read: Callable[[str, int, int, int], list[Any]],
    topic: str,
    offset: int,
    max_records: int,
    max_bytes: int,
    gate: ReadGate | None = None,
) -> list[Any]:
    """What ``read(topic, offset, max_records, max_bytes)`` (``LogStore.read`` or ``read_runs``) returns,
    read ``READ_SLICE`` records at a time with the event loop served between slices (every ``SLICE_S`` of
    work, each waiting for its turn on ``gate``, the request's socket: ``work_turn``): 100,000 records
    read whole held MQTT up for a few hundred milliseconds. Only the first slice may pass ``max_bytes``
    (with its one record); an error met after some records (retention, a damaged record) ends the read
    there, and the next read from its end says it."""
    items: list[Any] = []
    slice_end = time.monotonic() + SLICE_S
    while max_records > 0 and max_bytes > 0:
        asked = min(max_records, READ_SLICE)
        try:
            got = read(topic, offset, asked, max_bytes)
        except (OffsetOutOfRange, CorruptRecord):
            if items:
                return items
            raise
        size = sum(item.size for item in got)
        if not got or (items and size > max_bytes):  # the end, or a record over what is left
            return items
        items += got
        count, offset = _count_and_next(got, offset)
        if count < asked:  # the end, max_bytes or a damaged record: no need to ask again
            return items
        max_records -= count
        max_bytes -= size
        if time.monotonic() >= slice_end:
            await work_turn(gate)
            slice_end = time.monotonic() + SLICE_S
    return items


async def _built(gate: ReadGate | None, count: int, build: Callable[..., Any], *args: Any) -> Any:
    """``build(*args)``: at once for an answer of a few records, else in a thread of the loop's executor
    (the records it reads hold immutable bytes), as a piece of the work of the request on ``gate``."""
    if count <= INLINE_RECORDS:
        return build(*args)
    return await work_in_thread(gate, build, *args)


def _records_body(
    output: str, topic: str, records: Sequence[Any], metadata: Mapping[bytes, bytes]
) -> memoryview | bytes:
    """The body of a topic's read in ``output`` (its ``metadata`` goes into an Arrow stream)."""
    if output == "arrow":
        return _arrow_body([(topic, cast("list[FrameRun]", records))], metadata)
    if output == "jsonl":
        return jsonl_body(jsonl_record(topic, record) for record in cast("list[Record]", records))
    return frames_body(cast("list[Record]", records))


def _batch_lines(results: dict[str, dict[str, Any]], chunks: Sequence[tuple[str, list[Record]]]) -> bytes:
    """A batch fetch's JSON lines: its results, then every topic's records (each line made and encoded in
    turn: 100,000 lines alive at once gave the collector hundreds of thousands of objects to walk)."""
    lines = (jsonl_record(topic, record) for topic, records in chunks for record in records)
    return jsonl_body(itertools.chain(({"results": results},), lines))


async def _unescaped_topic(request: web.Request) -> web.StreamResponse:
    """``/v1/logs/plant/1/temp/records``: a topic sent with its slashes (404 saying how to send it)."""
    rest = request.match_info["rest"]
    topic, _, endpoint = rest.rpartition("/")
    if endpoint not in ("records", "offset"):
        topic, endpoint = rest, ""
    suggested = "/v1/logs/" + urllib.parse.quote(topic, safe="") + (f"/{endpoint}" if endpoint else "")
    shown = suggested if len(suggested) <= 120 else suggested[:120] + "..."
    raise ApiError(
        404,
        codes.NOT_FOUND,
        f"no such endpoint: a topic in a path is one segment, each '/' of it sent as %2F ({shown})",
    )


def _readable_topic(request: web.Request) -> str:
    """The request's ``{topic}``, which its access must allow (403 otherwise, before anything is read)."""
    topic = request.match_info["topic"]
    access = access_of(request)
    if not access.may_read(topic):
        raise forbidden(topic, access)
    return topic


def _count_and_next(read: Sequence[Record] | Sequence[FrameRun], offset: int) -> tuple[int, int]:
    """How many records a read from `offset` returned (`Record`s or runs) and the offset after them."""
    if not read:
        return 0, offset
    last = read[-1]
    if isinstance(last, Record):
        return len(read), last.offset + 1
    runs = cast("Sequence[FrameRun]", read)
    return sum(len(run) for run in runs), runs[-1].end
