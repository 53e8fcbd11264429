"""Options of the ``timestone`` streaming source: parsing and validation, with errors that name the option.

The option names mirror the Spark Kafka source (``startingOffsets``, ``maxOffsetsPerTrigger`` becomes
``maxRecordsPerTrigger``, ``failOnDataLoss``) so a Spark user finds what they expect. Spark hands options to
a Python data source with lower-cased keys, so every lookup here is case-insensitive; broker ids inside
option keys (``authToken.<broker id>``) are matched case-insensitively for the same reason.

Two ways to name what is read: ``brokers`` (standalone brokers, each with its own logs and offsets, keyed by
broker id) or ``bootstrapServers`` (some members of one cluster, which the source asks for the rest; every
replica holds the same records at the same offsets, so offsets are keyed by topic under ``clusterName``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import Enum

from broker_edge.config.endpoints import BrokerEndpoint, is_base_url, parse_endpoints
from broker_edge.config.loader import ConfigError
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.topics import SHARE_PREFIX, validate_topic_filter
from broker_edge.security.client_tls import ClientTls
from broker_edge.settings.uplink import site_topic

from .topic_cover import TopicMatcher

__all__ = [
    "EARLIEST",
    "LATEST",
    "SourceOptionError",
    "SourceOptions",
    "StartKind",
    "StartingOffsets",
    "parse_options",
    "tls_options",
]

EARLIEST = -2  # in a startingOffsets JSON, like Kafka
LATEST = -1

DEFAULT_FETCH_TIMEOUT_MS = 30_000
DEFAULT_FETCH_RETRIES = 3
DEFAULT_RETRY_BACKOFF_MS = 1_000
DEFAULT_MAX_BYTES_PER_FETCH = 16 * 1024 * 1024
MAX_BYTES_PER_FETCH = 64 * 1024 * 1024  # what the offsets API accepts (its ApiLimits.max_bytes)
DEFAULT_MAX_RECORDS_PER_PARTITION = 200_000
DEFAULT_MAX_TOPICS_PER_PARTITION = 500
MAX_TOPICS_PER_PARTITION = 10_000  # what one offsets API fetch request accepts (its ApiLimits.max_fetches)
MAX_READ_LIMIT = 2**63 - 1
"""The most records ``maxRecordsPerTrigger`` may say: Spark's JVM holds a query's read limit as a Long."""
MAX_WAIT_MS = 2**31 - 1  # about 24.8 days (Kafka's request.timeout.ms is as wide); sockets and sleeps take it
DEFAULT_CLUSTER_NAME = "cluster"
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")

_AUTH_TOKEN_PREFIX = "authtoken."

# Canonical spelling of every option, keyed by its lower-cased form.
_KNOWN = {
    name.lower(): name
    for name in (
        "brokers",
        "bootstrapServers",
        "clusterName",
        "topics",
        "startingOffsets",
        "maxRecordsPerTrigger",
        "maxRecordsPerPartition",
        "maxTopicsPerPartition",
        "minPartitions",
        "failOnDataLoss",
        "fetchTimeoutMs",
        "fetchRetries",
        "retryBackoffMs",
        "authToken",
        "maxBytesPerFetch",
        "readBy",
        "sites",
        "endAtQueryStart",
        "caFile",
        "certFile",
        "keyFile",
    )
}
READ_BY = ("partitions", "topics")
# Options Spark itself may pass to any source.
_IGNORED = {"path"}


class SourceOptionError(ValueError):
    """An option of the ``timestone`` source is missing or invalid; the message names the option."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"timestone source option '{option}': {message}")
        self.option = option


class StartKind(Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"
    SPECIFIC = "specific"


@dataclass(frozen=True, slots=True)
class StartingOffsets:
    """Where a new query starts (a restarted query always continues from its checkpoint).

    ``timestamp_ms`` is set for ``TIMESTAMP``; ``specific`` (broker id -> topic -> offset, with ``EARLIEST``
    and ``LATEST`` allowed as offsets) for ``SPECIFIC``. Reading a cluster, the one "broker id" is the
    cluster's name (users write ``{"topic": offset}``).
    """

    kind: StartKind
    timestamp_ms: int | None = None
    specific: Mapping[str, Mapping[str, int]] | None = None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The validated options of one ``timestone`` stream.

    Exactly one of ``brokers`` (standalone brokers) and ``bootstrap_servers`` (members of one cluster) is
    non-empty."""

    brokers: tuple[BrokerEndpoint, ...]
    topics: tuple[str, ...]
    bootstrap_servers: tuple[str, ...] = ()
    cluster_name: str = DEFAULT_CLUSTER_NAME
    """The cluster's key in checkpointed offsets and its rows' ``broker`` column (``bootstrap_servers``)."""
    auth_token: str | None = field(default=None, repr=False)
    """The cluster's token (``bootstrap_servers``; standalone brokers carry theirs in ``brokers``)."""
    starting_offsets: StartingOffsets = StartingOffsets(StartKind.LATEST)
    max_records_per_trigger: int | None = None
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    max_topics_per_partition: int = DEFAULT_MAX_TOPICS_PER_PARTITION
    """Topics one Spark task reads (one fetch request asks for all of them)."""
    #: None: the source's default (Spark's defaultParallelism when known, see ``timestone_source``)
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    fetch_timeout_ms: int = DEFAULT_FETCH_TIMEOUT_MS
    fetch_retries: int = DEFAULT_FETCH_RETRIES
    retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS
    max_bytes_per_fetch: int = DEFAULT_MAX_BYTES_PER_FETCH
    read_by: str = "partitions"
    """``partitions``: a new query reads a standalone broker by storage partition positions when the broker
    serves them and the start allows (earliest, latest, a time); ``topics``: always by topic offsets."""
    sites: bool = False
    """The brokers (or the cluster) are an uplink hub: each site's topic ``$site/<site_id>/<topic>`` is read
    as broker ``<site_id>``, topic ``<topic>`` (docs/uplink.md)."""
    tls: ClientTls | None = None
    """The CAs ``https://`` brokers are checked with, and the certificate presented to them (``caFile``,
    ``certFile``, ``keyFile``; None: the system's CAs, no certificate)."""
    end_at_query_start: bool = False
    """Read what the brokers held when the query started, then nothing more: what ``availableNow`` does on
    Spark 4.2+, for a processing-time query on Spark 4.0 and 4.1 (``pipelines.available_now``)."""

    @property
    def log_patterns(self) -> tuple[str, ...]:
        """The filters the brokers' logs are listed with: ``topics``, or on a hub (``sites``) each of them
        under every site (``$site/+/<filter>``)."""
        return tuple(site_topic("+", topic) for topic in self.topics) if self.sites else self.topics

    @property
    def reads_cluster(self) -> bool:
        """Whether the stream reads a cluster (``bootstrapServers``) rather than standalone brokers."""
        return bool(self.bootstrap_servers)

    def broker(self, broker_id: str) -> BrokerEndpoint:
        """The endpoint of ``broker_id`` (KeyError if it is not one of the ``brokers`` option)."""
        for endpoint in self.brokers:
            if endpoint.name == broker_id:
                return endpoint
        raise KeyError(broker_id)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the options given to ``spark.readStream.format("timestone")``.

    Raises SourceOptionError naming the first bad option; unknown options are errors too (a misspelt
    ``startingOffset`` silently meaning "latest" would lose data).
    """
    lowered = {key.lower(): value for key, value in options.items()}
    for key in lowered:
        if key not in _KNOWN and key not in _IGNORED and not key.startswith(_AUTH_TOKEN_PREFIX):
            known = ", ".join(sorted(_KNOWN.values()))
            raise SourceOptionError(key, f"unknown option (known options: {known}, authToken.<broker id>)")

    default_token = _checked_token("authToken", _optional_text(lowered, "authToken"))
    bootstrap = _parse_bootstrap(lowered)
    if bootstrap:
        brokers: tuple[BrokerEndpoint, ...] = ()
        cluster_name = _parse_cluster_name(lowered)
        starting = _parse_starting_offsets(lowered.get("startingoffsets", "latest"), [], cluster_name)
    else:
        if _optional_text(lowered, "clusterName") is not None:
            raise SourceOptionError(
                "clusterName", "names a cluster read through bootstrapServers, which is not set"
            )
        brokers = _apply_broker_tokens(lowered, _parse_brokers(_required(lowered, "brokers"), default_token))
        cluster_name = DEFAULT_CLUSTER_NAME
        starting = _parse_starting_offsets(
            lowered.get("startingoffsets", "latest"), [endpoint.name for endpoint in brokers]
        )

    parsed = SourceOptions(
        brokers=brokers,
        topics=_parse_topics(_required(lowered, "topics")),
        bootstrap_servers=bootstrap,
        cluster_name=cluster_name,
        auth_token=default_token if bootstrap else None,
        starting_offsets=starting,
        max_records_per_trigger=_optional_int(
            lowered, "maxRecordsPerTrigger", minimum=1, maximum=MAX_READ_LIMIT, why=_LONG
        ),
        max_records_per_partition=_optional_int(lowered, "maxRecordsPerPartition", minimum=1)
        or DEFAULT_MAX_RECORDS_PER_PARTITION,
        max_topics_per_partition=_int(
            lowered,
            "maxTopicsPerPartition",
            DEFAULT_MAX_TOPICS_PER_PARTITION,
            minimum=1,
            maximum=MAX_TOPICS_PER_PARTITION,
        ),
        min_partitions=_optional_int(lowered, "minPartitions", minimum=1),
        fail_on_data_loss=_bool(lowered, "failOnDataLoss", default=True),
        sites=_bool(lowered, "sites", default=False),
        end_at_query_start=_bool(lowered, "endAtQueryStart", default=False),
        fetch_timeout_ms=_int(
            lowered, "fetchTimeoutMs", DEFAULT_FETCH_TIMEOUT_MS, minimum=1, maximum=MAX_WAIT_MS, why=_WAIT
        ),
        fetch_retries=_int(lowered, "fetchRetries", DEFAULT_FETCH_RETRIES, minimum=0),
        retry_backoff_ms=_int(
            lowered, "retryBackoffMs", DEFAULT_RETRY_BACKOFF_MS, minimum=0, maximum=MAX_WAIT_MS, why=_WAIT
        ),
        max_bytes_per_fetch=_int(
            lowered,
            "maxBytesPerFetch",
            DEFAULT_MAX_BYTES_PER_FETCH,
            minimum=1024,
            maximum=MAX_BYTES_PER_FETCH,
        ),
        read_by=_choice(lowered, "readBy", READ_BY),
        tls=_parse_tls(lowered),
    )
    _check_start_topics(parsed)
    return parsed


_TLS_OPTIONS = {"cafile": "caFile", "certfile": "certFile", "keyfile": "keyFile"}
"""The TLS options, by the ``ClientTls`` field each sets."""


def tls_options(tls: ClientTls | None) -> dict[str, str]:
    """The options that give the source ``tls``'s files (none for None)."""
    if tls is None:
        return {}
    files = {option: getattr(tls, field) for field, option in _TLS_OPTIONS.items()}
    return {option: path for option, path in files.items() if path is not None}


def _parse_tls(options: Mapping[str, str]) -> ClientTls | None:
    """``caFile``, ``certFile`` and ``keyFile`` (None: none given), their files loaded now, so that one that
    does not load fails the query at its start naming its option, not each task."""
    files = {field: _optional_text(options, option) for field, option in _TLS_OPTIONS.items()}
    if not any(files.values()):
        return None
    try:
        tls = ClientTls(**files)
        tls.context()
    except ConfigError as error:
        option = _TLS_OPTIONS[error.path]
        raise SourceOptionError(option, error.detail) from None
    return tls


def _check_start_topics(options: SourceOptions) -> None:
    """Refuse a JSON start naming a topic no filter of ``topics`` reads: it would stay in the checkpoint,
    never read, while the topic meant (misspelt, or a site's without its ``$site/<site_id>/``) started at
    its log start."""
    read = TopicMatcher(options.log_patterns)  # (thousands of named topics: looked up, not matched each)
    for broker, topics in (options.starting_offsets.specific or {}).items():
        for topic in topics:
            if not read(topic):
                where = "" if options.reads_cluster else f" (broker {broker!r})"
                raise SourceOptionError(
                    "startingOffsets",
                    f"topic {topic!r}{where} is matched by no filter of 'topics' "
                    f"({', '.join(options.log_patterns)}), so it would never be read",
                )


def _parse_bootstrap(options: Mapping[str, str]) -> tuple[str, ...]:
    """The ``bootstrapServers`` URLs (empty when the option is absent); refuses it beside ``brokers``."""
    raw = options.get("bootstrapservers")
    if raw is None:
        return ()
    if options.get("brokers") is not None:
        raise SourceOptionError(
            "bootstrapServers",
            "give either brokers (standalone brokers) or bootstrapServers (members of one cluster), not both",
        )
    for key in options:
        if key.startswith(_AUTH_TOKEN_PREFIX):
            raise SourceOptionError(
                f"authToken.{key[len(_AUTH_TOKEN_PREFIX) :]}",
                "per-broker tokens belong to the brokers option; a cluster's members share one token: "
                "use authToken",
            )
    urls: list[str] = []
    for item in (part.strip().rstrip("/") for part in raw.split(",")):
        if not is_base_url(item):
            raise SourceOptionError(
                "bootstrapServers",
                f"expected comma-separated offsets API base URLs of cluster members "
                f"(e.g. http://b1:9884,http://b2:9884), got {item!r} in {raw!r}",
            )
        if item not in urls:
            urls.append(item)
    return tuple(urls)


def _parse_cluster_name(options: Mapping[str, str]) -> str:
    raw = options.get("clustername")
    if raw is None:
        return DEFAULT_CLUSTER_NAME
    name = raw.strip()
    if not _CLUSTER_NAME.match(name):
        raise SourceOptionError("clusterName", f"expected letters, digits and _.- only, got {raw!r}")
    return name


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name.lower())
    if value is None or not value.strip():
        alternative = " (or bootstrapServers, to read a cluster)" if name == "brokers" else ""
        raise SourceOptionError(name, f"is required{alternative}")
    return value.strip()


def _optional_text(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    return value if value else None


def _checked_token(option: str, token: str | None) -> str | None:
    """``token`` if an ``Authorization: Bearer`` header can carry it (printable ASCII, no surrounding
    space); the error never shows it."""
    if token and not (token.isascii() and token.isprintable() and token == token.strip()):
        raise SourceOptionError(
            option,
            f"a bearer token is printable ASCII without leading or trailing spaces (an HTTP header "
            f"carries nothing else); this one of {len(token)} characters is not (it is not shown here)",
        )
    return token


def _optional_int(
    options: Mapping[str, str], name: str, minimum: int, maximum: int | None = None, why: str = ""
) -> int | None:
    """The option as an integer within ``[minimum, maximum]`` (``why``: what the maximum is), None when
    not given."""
    value = _given_int(options, name, minimum)
    if value is not None and maximum is not None and value > maximum:
        raise SourceOptionError(name, f"expected an integer <= {maximum} ({why}), got {value}")
    return value


def _given_int(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise SourceOptionError(name, f"expected an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise SourceOptionError(name, f"expected an integer >= {minimum}, got {value}")
    return value


_API_LIMIT = "the offsets API's limit"
_WAIT = "about 24.8 days, in milliseconds"
_LONG = "Spark holds a read limit as a Long"


def _int(
    options: Mapping[str, str],
    name: str,
    default: int,
    minimum: int,
    maximum: int | None = None,
    why: str = _API_LIMIT,
) -> int:
    """The option as an integer within ``[minimum, maximum]``, else ``default``."""
    value = _optional_int(options, name, minimum, maximum, why)
    return default if value is None else value


def _choice(options: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first is the default), case-insensitive."""
    raw = options.get(name.lower())
    if raw is None:
        return choices[0]
    text = raw.strip().lower()
    if text not in choices:
        raise SourceOptionError(name, f"expected one of {', '.join(choices)}, got {raw!r}")
    return text


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = raw.strip().lower()
    if text == "true":
        return True
    if text == "false":
        return False
    raise SourceOptionError(name, f"expected true or false, got {raw!r}")


def _parse_brokers(raw: str, default_token: str | None) -> tuple[BrokerEndpoint, ...]:
    try:
        endpoints = parse_endpoints(raw)
    except ConfigError as exc:
        raise SourceOptionError("brokers", exc.detail) from None
    return tuple(replace(endpoint, token=default_token) for endpoint in endpoints)


def _apply_broker_tokens(
    options: Mapping[str, str], brokers: tuple[BrokerEndpoint, ...]
) -> tuple[BrokerEndpoint, ...]:
    by_lowered_id = {endpoint.name.lower(): endpoint for endpoint in brokers}
    tokens: dict[str, str] = {}
    for key, value in options.items():
        if not key.startswith(_AUTH_TOKEN_PREFIX):
            continue
        broker_key = key[len(_AUTH_TOKEN_PREFIX) :]
        if broker_key not in by_lowered_id:
            raise SourceOptionError(
                f"authToken.{broker_key}",
                f"names no broker of the 'brokers' option ({', '.join(by_lowered_id)})",
            )
        tokens[by_lowered_id[broker_key].name] = _checked_token(f"authToken.{broker_key}", value) or value
    return tuple(replace(endpoint, token=tokens.get(endpoint.name, endpoint.token)) for endpoint in brokers)


def _parse_topics(raw: str) -> tuple[str, ...]:
    patterns: dict[str, None] = {}  # (in order, each once: thousands of named topics are looked up)
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            raise SourceOptionError("topics", f"empty topic filter in {raw!r}")
        if item.startswith(SHARE_PREFIX):
            raise SourceOptionError("topics", f"shared subscriptions mean nothing to a log reader: {item!r}")
        try:
            validate_topic_filter(item)
        except InvalidTopic as error:
            raise SourceOptionError("topics", str(error)) from None
        patterns[item] = None
    return tuple(patterns)


def _parse_starting_offsets(raw: str, broker_ids: list[str], cluster: str | None = None) -> StartingOffsets:
    """``cluster``: the stream reads that cluster, whose JSON form is ``{"topic": offset}``."""
    text = raw.strip()
    lowered = text.lower()
    if lowered == "earliest":
        return StartingOffsets(StartKind.EARLIEST)
    if lowered == "latest":
        return StartingOffsets(StartKind.LATEST)
    if text.startswith("{"):
        if cluster is not None:
            return StartingOffsets(StartKind.SPECIFIC, specific={cluster: _parse_topic_offsets(text)})
        return StartingOffsets(StartKind.SPECIFIC, specific=_parse_specific(text, broker_ids))
    if lowered.startswith("time:"):
        return StartingOffsets(StartKind.TIMESTAMP, timestamp_ms=_parse_time(text[5:].strip()))
    if text[:1].isdigit() and "-" in text:
        return StartingOffsets(StartKind.TIMESTAMP, timestamp_ms=_parse_time(text))
    raise SourceOptionError(
        "startingOffsets",
        "expected earliest, latest, time:<epoch ms>, time:<ISO-8601>, an ISO-8601 timestamp or a JSON "
        + ('{"topic": offset}' if cluster is not None else '{"broker": {"topic": offset}}')
        + f", got {raw!r}",
    )


#: The latest epoch millisecond a broker takes as a start time (a signed 64-bit integer).
_LAST_TIME_MS = 2**63 - 1


def _parse_time(text: str) -> int:
    """Epoch milliseconds of ``time:``'s value, or of an ISO-8601 timestamp written without it (at or after
    the Unix epoch: a broker's times are not negative)."""
    if text.isascii() and text.isdigit():
        if int(text) > _LAST_TIME_MS:
            raise SourceOptionError(
                "startingOffsets", f"{text} epoch milliseconds is past any time a log holds"
            )
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise SourceOptionError(
            "startingOffsets", f"expected epoch milliseconds or an ISO-8601 timestamp, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(
            tzinfo=UTC
        )  # a timestamp without offset is UTC, like spark.sql.session.timeZone
    milliseconds = int(moment.timestamp() * 1000)
    if milliseconds < 0:
        raise SourceOptionError(
            "startingOffsets",
            f"{text!r} is before 1970-01-01T00:00:00Z, the first time a log holds (earliest reads from "
            "the first record)",
        )
    return milliseconds


def _load_json(text: str) -> object:
    """A hand-written JSON start, refusing a key given twice in one object (JSON's last would win)."""

    def unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
        seen: dict[str, object] = {}
        for key, item in pairs:
            if key in seen:
                raise SourceOptionError("startingOffsets", f"{key!r} twice in one JSON object")
            seen[key] = item
        return seen

    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as error:
        raise SourceOptionError("startingOffsets", f"invalid JSON: {error}") from None


def _parse_specific(text: str, broker_ids: list[str]) -> dict[str, dict[str, int]]:
    value = _load_json(text)
    shape = '{"broker id": {"topic": offset}} with -2 = earliest, -1 = latest'
    if not isinstance(value, dict):
        raise SourceOptionError("startingOffsets", f"expected {shape}")
    result: dict[str, dict[str, int]] = {}
    for broker_id, topics in value.items():
        if broker_id not in broker_ids:
            raise SourceOptionError(
                "startingOffsets",
                f"broker {broker_id!r} is not one of the 'brokers' option ({', '.join(broker_ids)})",
            )
        if not isinstance(topics, dict):
            raise SourceOptionError("startingOffsets", f"broker {broker_id!r}: expected {shape}")
        _check_offsets(topics, f"broker {broker_id!r} ")
        result[broker_id] = dict(topics)
    return result


def _parse_topic_offsets(text: str) -> dict[str, int]:
    """A cluster's JSON start: ``{"topic": offset}`` (offsets are the same on every replica)."""
    value = _load_json(text)
    if not isinstance(value, dict) or any(isinstance(offset, dict) for offset in value.values()):
        raise SourceOptionError(
            "startingOffsets",
            'reading a cluster, expected {"topic": offset} with -2 = earliest, -1 = latest '
            "(offsets are the same on every member)",
        )
    _check_offsets(value, "")
    return dict(value)


def _check_offsets(topics: Mapping[str, object], where: str) -> None:
    for topic, offset in topics.items():
        if not topic or "+" in topic or "#" in topic or "\0" in topic:
            raise SourceOptionError(
                "startingOffsets", f"{where}{topic!r} is not a topic name (no wildcard, not empty)"
            )
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise SourceOptionError(
                "startingOffsets", f"{where}topic {topic!r}: expected an offset >= -2, got {offset!r}"
            )
