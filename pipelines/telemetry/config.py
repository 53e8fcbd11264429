"""The telemetry pipeline's configuration: ``conf/pipeline.yaml``'s ``telemetry`` section as dataclasses.

Loaded with :func:`broker_edge.config.loader.load_dataclass`, so an unknown key or a wrong type names its
dotted path. Cross-field rules (an expectation on a column the payload does not declare, a topic template
without ``{device_id}``) are checked here too, because a typo there would otherwise surface as an analysis
error inside the first micro-batch, far from the file that caused it.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from broker_edge.config.endpoints import parse_endpoint
from broker_edge.config.loader import ConfigError, load_dataclass, load_yaml_file
from pipelines.maintenance.config import MaintenanceConfig
from pipelines.payloads.config import TopicFormat, check_formats, check_sparkplug_groups, field_formats
from pipelines.payloads.formats import FieldFormat
from pipelines.spark_interval import interval_ms
from pipelines.supervisor import RestartConfig
from sources.options import SourceOptionError, parse_options

#: Columns every parsed telemetry row has, besides the configured payload fields.
STANDARD_COLUMNS: tuple[str, ...] = ("device_id", "event_time", "broker", "topic", "offset", "timestamp")
#: The types of the standard columns, as an expectation on them reads them.
STANDARD_TYPES: dict[str, str] = {
    "device_id": "string",
    "event_time": "timestamp",
    "broker": "string",
    "topic": "string",
    "offset": "bigint",
    "timestamp": "timestamp",
}
#: Other columns the job gives a record on its way to the tables: a payload field may not take their names.
RESERVED_COLUMNS: frozenset[str] = frozenset(
    {"client_id", "qos", "retain", "properties", "payload", "ingest_date", "ingested_at", "event_date"}
    | {"is_telemetry", "topic_tags", "parse_error", "parse_detail", "failed_expectations"}
    | {"duplicate"}
)

#: Spark SQL type names a payload field may declare (what ``sinks.tables.parse_fields`` understands).
PAYLOAD_TYPES: frozenset[str] = frozenset(
    {"string", "boolean", "tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long"}
    | {"float", "double", "date", "timestamp"}
)
NUMERIC_TYPES: frozenset[str] = frozenset(
    {"tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long", "float", "double"}
)

#: Python's named group or back reference, which Java's regular expressions refuse (unless escaped).
_PYTHON_GROUP = re.compile(r"(?<!\\)\(\?P[<=]")
_PLACEHOLDER = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_REGEX_SPECIAL = set(".^$*+?()[]{}|\\")


@dataclass(frozen=True)
class TopicTemplate:
    """A topic pattern such as ``devices/{device_id}/telemetry``; each ``{name}`` fills one whole level.

    It yields both the MQTT filter the source subscribes to (``devices/+/telemetry``) and a regular
    expression whose groups extract the placeholders, written so Python and Java (Spark's ``rlike``,
    ``regexp_extract``) read it the same way.
    """

    template: str

    def __post_init__(self) -> None:
        if not self.template or "#" in self.template or "+" in self.template:
            raise ValueError(f"topic template {self.template!r} must be a topic name with {{placeholders}}")
        names = [m.group(1) for level in self.levels if (m := _PLACEHOLDER.match(level))]
        for level in self.levels:
            if ("{" in level or "}" in level) and not _PLACEHOLDER.match(level):
                raise ValueError(f"topic template {self.template!r}: a placeholder must fill a whole level")
        if "device_id" not in names:
            raise ValueError(f"topic template {self.template!r} has no {{device_id}} level")
        if len(set(names)) != len(names):
            raise ValueError(f"topic template {self.template!r} repeats a placeholder")

    @property
    def levels(self) -> list[str]:
        return self.template.split("/")

    @property
    def placeholders(self) -> list[str]:
        """Placeholder names in level order; ``regex`` group ``i + 1`` captures ``placeholders[i]``."""
        return [m.group(1) for level in self.levels if (m := _PLACEHOLDER.match(level))]

    @property
    def topic_filter(self) -> str:
        return "/".join("+" if _PLACEHOLDER.match(level) else level for level in self.levels)

    @property
    def regex(self) -> str:
        parts = []
        for level in self.levels:
            if _PLACEHOLDER.match(level):
                parts.append("([^/]*)")  # an empty level too, as the filter's + matches it
            else:
                parts.append("".join(f"\\{c}" if c in _REGEX_SPECIAL else c for c in level))
        return "^" + "/".join(parts) + "$"


@dataclass
class SourceConfig:
    """Where records come from: options of the ``timestone`` streaming source."""

    brokers: list[str] = field(default_factory=lambda: ["edge1=http://127.0.0.1:9884"])
    """Offsets APIs to read, each ``name=url`` (or a bare ``url``), as ``config.endpoints`` parses them."""
    bootstrap_servers: list[str] = field(default_factory=list)
    """Offsets API URLs of some members of a broker cluster: when given, the cluster is read instead of
    ``brokers`` (the source's ``bootstrapServers``)."""
    topics: list[str] = field(default_factory=list)
    starting_offsets: str = "earliest"
    max_records_per_trigger: int | None = 250_000
    fail_on_data_loss: bool = True
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.brokers:
            raise ConfigError("brokers", "at least one broker offsets API is required")
        for index, text in enumerate(self.brokers):
            try:
                parse_endpoint(text)
            except ConfigError as exc:
                raise ConfigError(f"brokers[{index}]", exc.detail) from None
        for index, url in enumerate(self.bootstrap_servers):
            if "," in url or not url.startswith(("http://", "https://")):
                raise ConfigError(f"bootstrap_servers[{index}]", f"expected an http(s) base URL, got {url!r}")
        if self.max_records_per_trigger is not None and self.max_records_per_trigger < 1:
            raise ConfigError("max_records_per_trigger", "must be >= 1 (or null for no limit)")


@dataclass
class TablesConfig:
    """Where the Delta tables live and which store writes them."""

    root: str = ".timestone/tables"
    backend: Literal["auto", "delta-rs", "native"] = "auto"
    namespace: str | None = None
    storage_options: dict[str, str] = field(default_factory=dict)
    """delta-rs only: object-store settings of ``root`` (credentials, endpoint), read by the driver's commits
    and by the Spark tasks writing data files."""
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    """Compaction, vacuum and log clean-up of every table the job writes, run by the job itself."""


@dataclass
class StreamConfig:
    """The streaming query: name, checkpoint and trigger."""

    query_name: str = "telemetry"
    checkpoint: str = ".timestone/checkpoints/telemetry"
    trigger_interval: str = "1 second"
    restart: RestartConfig = field(default_factory=RestartConfig)
    """How a failed query is restarted from its checkpoint (pipelines/supervisor.py)."""

    def __post_init__(self) -> None:
        try:  # Spark reads it only when the query starts; checked even when --available-now replaces it
            interval_ms(self.trigger_interval)
        except ValueError as exc:
            raise ConfigError("trigger_interval", str(exc)) from None


@dataclass
class PayloadConfig:
    """How a telemetry record becomes a silver row."""

    topic_template: str = "devices/{device_id}/telemetry"
    fields: dict[str, str] = field(
        default_factory=lambda: {
            "ts": "bigint",
            "seq": "bigint",
            "temperature": "double",
            "humidity": "double",
            "battery": "double",
            "firmware": "string",
            "group": "string",
        }
    )
    event_time_field: str | None = "ts"
    event_time_unit: Literal["epoch_ms", "epoch_s", "iso8601"] = "epoch_ms"
    formats: list[TopicFormat] = field(default_factory=list)
    """Payload formats per topic template (docs/payload-formats.md). ``topic_template``'s payloads are JSON
    unless an entry names that template with another format; an entry with another template adds its topics
    (read into the same ``fields``), and a ``sparkplug_b`` entry adds its Sparkplug B group(s)."""
    readers: dict[str, FieldFormat] = field(init=False, repr=False, compare=False, default_factory=dict)
    """Each telemetry template's format, its files read (what the executors get): set when loaded."""

    def __post_init__(self) -> None:
        try:
            TopicTemplate(self.topic_template)
        except ValueError as exc:
            raise ConfigError("topic_template", str(exc)) from None
        check_formats(self.formats, whole="telemetry.payload.formats")
        for index, entry in enumerate(self.formats):
            if entry.format == "sparkplug_b":
                continue
            try:
                TopicTemplate(entry.topic_template)
            except ValueError as exc:
                raise ConfigError(f"formats[{index}].topic_template", str(exc)) from None
        check_sparkplug_groups(self.topic_template, self.formats)
        if not self.fields:
            raise ConfigError("fields", "declare at least one payload field")
        for name, type_name in self.fields.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ConfigError(f"fields.{name}", "not a valid column name")
            if type_name.strip().lower() not in PAYLOAD_TYPES:
                raise ConfigError(
                    f"fields.{name}", f"unknown type {type_name!r}; one of {sorted(PAYLOAD_TYPES)}"
                )
            if name in STANDARD_COLUMNS or name in RESERVED_COLUMNS or name.startswith("_"):
                raise ConfigError(f"fields.{name}", "clashes with a column the pipeline adds")
        if self.event_time_field is not None and self.event_time_field not in self.fields:
            raise ConfigError("event_time_field", f"{self.event_time_field!r} is not one of fields")
        types = {name: type_name.strip().lower() for name, type_name in self.fields.items()}
        self.readers = {
            self.topic_template: FieldFormat("json"),
            **field_formats(self.formats, types, event_time_field=self.event_time_field),
        }

    @cached_property
    def template(self) -> TopicTemplate:
        return TopicTemplate(self.topic_template)

    @cached_property
    def templates(self) -> list[tuple[TopicTemplate, FieldFormat]]:
        """Every telemetry topic template with the format of its payloads: ``topic_template`` first."""
        return [(TopicTemplate(template), reader) for template, reader in self.readers.items()]

    @property
    def sparkplug_filters(self) -> list[str]:
        """The MQTT filters of the ``sparkplug_b`` entries (none: no Sparkplug B is read)."""
        filters = [entry.sparkplug_filter for entry in self.formats if entry.format == "sparkplug_b"]
        return list(dict.fromkeys(filters))

    @property
    def silver_fields(self) -> dict[str, str]:
        """Payload columns stored in silver: every field except the one that became ``event_time``."""
        return {n: t.strip().lower() for n, t in self.fields.items() if n != self.event_time_field}


@dataclass
class DedupConfig:
    """Duplicates beyond (broker, topic, offset): one device message stored twice (re-sent, two brokers)."""

    message_id_fields: list[str] = field(default_factory=lambda: ["seq"])
    window_seconds: int = 600
    state_timeout_seconds: int = 86_400
    """A device silent this long (processing time) forgets the message ids it sent (its dedup state)."""

    def __post_init__(self) -> None:
        if self.window_seconds < 0:
            raise ConfigError("window_seconds", "must be >= 0")
        if self.state_timeout_seconds < 1:
            raise ConfigError("state_timeout_seconds", "must be >= 1")


ExpectationType = Literal[
    "expect_column_values_to_not_be_null",
    "expect_column_values_to_be_between",
    "expect_column_values_to_be_in_set",
    "expect_column_values_to_not_be_in_set",
    "expect_column_values_to_match_regex",
    "expect_column_value_lengths_to_be_between",
]


@dataclass
class ExpectationConfig:
    """One row-level Great Expectations expectation; the keyword names are GX's own."""

    type: ExpectationType
    column: str
    min_value: float | None = None
    max_value: float | None = None
    strict_min: bool = False
    strict_max: bool = False
    value_set: list[Any] | None = None
    regex: str | None = None
    mostly: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.mostly <= 1.0:
            raise ConfigError("mostly", "must be between 0 and 1")
        bounded = self.type in (
            "expect_column_values_to_be_between",
            "expect_column_value_lengths_to_be_between",
        )
        if bounded and self.min_value is None and self.max_value is None:
            raise ConfigError("min_value", f"{self.type} needs min_value, max_value or both")
        if not bounded and (self.min_value is not None or self.max_value is not None):
            raise ConfigError("min_value", f"{self.type} takes no min_value/max_value")
        if bounded:
            self._check_bounds()
        in_set = self.type in ("expect_column_values_to_be_in_set", "expect_column_values_to_not_be_in_set")
        if in_set and not self.value_set:
            raise ConfigError("value_set", f"{self.type} needs a non-empty value_set")
        if not in_set and self.value_set is not None:
            raise ConfigError("value_set", f"{self.type} takes no value_set")
        is_regex = self.type == "expect_column_values_to_match_regex"
        if is_regex and not self.regex:
            raise ConfigError("regex", f"{self.type} needs a regex")
        if not is_regex and self.regex is not None:
            raise ConfigError("regex", f"{self.type} takes no regex")
        if is_regex and self.regex:
            try:  # Spark's tasks would fail on it in every batch, the query restarted for ever
                re.compile(self.regex)
            except re.error as exc:
                raise ConfigError("regex", f"not a regular expression: {exc}") from None
            if _PYTHON_GROUP.search(self.regex):  # Spark reads it as Java does, GX as Python does
                raise ConfigError(
                    "regex",
                    "(?P<name>...) and (?P=name) are Python's, and Java's regular expressions, as Spark "
                    "reads them, refuse them (every batch would fail): use a plain group (...)",
                )

    def _check_bounds(self) -> None:
        """Bounds no value meets (swapped, or one value excluded by a strict bound) would quarantine every
        row: refused."""
        low, high = self.min_value, self.max_value
        if low is None or high is None:
            return
        if high < low:
            raise ConfigError("max_value", f"{high:g} is below min_value {low:g}: no value is between them")
        if high == low and (self.strict_min or self.strict_max):
            raise ConfigError("max_value", f"equals min_value {low:g} with a strict bound: no value meets it")

    @property
    def name(self) -> str:
        """How quarantine rows and ``dq_results`` name this expectation: type and column."""
        return f"{self.type}({self.column})"

    def gx_kwargs(self) -> dict[str, Any]:
        """The keyword arguments GX's expectation class takes (unset ones left out)."""
        kwargs: dict[str, Any] = {"column": self.column}
        if self.min_value is not None:
            kwargs["min_value"] = self.min_value
        if self.max_value is not None:
            kwargs["max_value"] = self.max_value
        if self.type.endswith("_to_be_between"):
            kwargs["strict_min"] = self.strict_min
            kwargs["strict_max"] = self.strict_max
        if self.value_set is not None:
            kwargs["value_set"] = list(self.value_set)
        if self.regex is not None:
            kwargs["regex"] = self.regex
        if self.mostly != 1.0:
            kwargs["mostly"] = self.mostly
        return kwargs


def _check_column_type(expectation: ExpectationConfig, kind: str, path: str) -> None:
    """Refuse an expectation its column's type cannot meet: Spark would cast every value of the column to
    the bound's or the set's type, failing each batch (or the query's analysis) instead of naming the key."""
    column = expectation.column
    if expectation.type == "expect_column_values_to_be_between" and kind not in NUMERIC_TYPES:
        raise ConfigError(
            f"{path}.column", f"{expectation.type} needs a numeric column; {column!r} is {kind}"
        )
    if expectation.type == "expect_column_value_lengths_to_be_between" and kind != "string":
        raise ConfigError(f"{path}.column", f"{expectation.type} needs a string column; {column!r} is {kind}")
    for index, value in enumerate(expectation.value_set or []):
        if value is not None and not _is_value_of(value, kind):
            raise ConfigError(
                f"{path}.value_set[{index}]", f"{value!r} is no {kind}, the type of column {column!r}"
            )


def _is_value_of(value: Any, kind: str) -> bool:
    """Whether ``value`` (from YAML) is one of the values of a column of type ``kind``."""
    if kind in NUMERIC_TYPES:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("date", "timestamp"):
        return isinstance(value, str | dt.date)  # YAML reads an unquoted 2026-01-01 as a date
    return isinstance(value, str)


@dataclass
class SuiteConfig:
    """A named expectation suite; every expectation of every suite gates every silver row."""

    name: str
    expectations: list[ExpectationConfig] = field(default_factory=list)

    def __post_init__(self) -> None:
        first: dict[str, int] = {}
        for index, expectation in enumerate(self.expectations):
            earlier = first.setdefault(expectation.name, index)
            if earlier != index:  # rows and dq_results could not tell the two apart: one would go unchecked
                raise ConfigError(
                    f"expectations[{index}]",
                    f"{expectation.name} is already expectations[{earlier}]: quarantined rows and dq_results "
                    "name an expectation by its type and column, so make them one expectation (both bounds "
                    "in one) or put the second in another suite",
                )


@dataclass
class GxRunConfig:
    """When and how the real Great Expectations validation runs (row routing runs every batch regardless)."""

    engine: Literal["pandas", "spark"] = "pandas"
    schedule: Literal["every_batch", "every_n_batches", "interval", "never"] = "every_batch"
    every_n_batches: int = 10
    interval_seconds: float = 60.0
    max_rows: int = 10_000

    def __post_init__(self) -> None:
        if self.every_n_batches < 1:
            raise ConfigError("every_n_batches", "must be >= 1")
        if self.interval_seconds <= 0:
            raise ConfigError("interval_seconds", "must be > 0")
        if self.max_rows < 1:
            raise ConfigError("max_rows", "must be >= 1")


@dataclass
class QualityConfig:
    suites: list[SuiteConfig] = field(
        default_factory=lambda: [
            SuiteConfig(
                name="telemetry_basic",
                expectations=[
                    ExpectationConfig(type="expect_column_values_to_not_be_null", column="device_id"),
                    ExpectationConfig(
                        type="expect_column_values_to_be_between",
                        column="temperature",
                        min_value=-40.0,
                        max_value=125.0,
                    ),
                ],
            )
        ]
    )
    gx: GxRunConfig = field(default_factory=GxRunConfig)

    def __post_init__(self) -> None:
        names = [suite.name for suite in self.suites]
        if len(set(names)) != len(names):
            raise ConfigError("suites", f"suite names must be unique, got {names}")


@dataclass
class DevicesConfig:
    """Where the ``devices`` table's attributes come from."""

    firmware_field: str | None = "firmware"
    group_field: str | None = "group"
    tag_fields: list[str] = field(default_factory=list)
    status_topic_template: str | None = None
    status_firmware_field: str = "firmware"

    def __post_init__(self) -> None:
        if self.status_topic_template is not None:
            try:
                TopicTemplate(self.status_topic_template)
            except ValueError as exc:
                raise ConfigError("status_topic_template", str(exc)) from None

    @cached_property
    def status_template(self) -> TopicTemplate | None:
        return None if self.status_topic_template is None else TopicTemplate(self.status_topic_template)


@dataclass
class GoldConfig:
    minute_metrics: list[str] = field(default_factory=lambda: ["temperature", "humidity", "battery"])
    devices: DevicesConfig = field(default_factory=DevicesConfig)


@dataclass
class TelemetryConfig:
    """The whole telemetry pipeline; every section has defaults that run against a local broker."""

    source: SourceConfig = field(default_factory=SourceConfig)
    tables: TablesConfig = field(default_factory=TablesConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    payload: PayloadConfig = field(default_factory=PayloadConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    gold: GoldConfig = field(default_factory=GoldConfig)

    def __post_init__(self) -> None:
        fields = self.payload.fields
        for i, name in enumerate(self.dedup.message_id_fields):
            if name not in fields:
                raise ConfigError(f"dedup.message_id_fields[{i}]", f"{name!r} is not a payload field")
            if name == self.payload.event_time_field:
                raise ConfigError(
                    f"dedup.message_id_fields[{i}]",
                    f"{name!r} is the event time, which window_seconds already compares "
                    "(window_seconds: 0 means the same event time exactly)",
                )
        for i, name in enumerate(self.gold.minute_metrics):
            if fields.get(name, "").lower() not in NUMERIC_TYPES or name == self.payload.event_time_field:
                raise ConfigError(f"gold.minute_metrics[{i}]", f"{name!r} is not a numeric payload field")
        devices = self.gold.devices
        for key in ("firmware_field", "group_field"):
            value = getattr(devices, key)
            if value is not None and value not in self.payload.silver_fields:
                raise ConfigError(f"gold.devices.{key}", f"{value!r} is not a payload field")
        levels = {
            p: t.template for t, _ in self.payload.templates for p in t.placeholders if p != "device_id"
        }
        for i, name in enumerate(devices.tag_fields):
            if name not in self.payload.silver_fields:
                raise ConfigError(f"gold.devices.tag_fields[{i}]", f"{name!r} is not a payload field")
            if name in devices.tag_fields[:i]:  # devices.tags is a map: a key twice fails each batch
                earlier = devices.tag_fields.index(name)
                raise ConfigError(
                    f"gold.devices.tag_fields[{i}]", f"already gold.devices.tag_fields[{earlier}]"
                )
            if name in levels:
                raise ConfigError(
                    f"gold.devices.tag_fields[{i}]",
                    f"{name!r} is also a {{{name}}} level of the topic template {levels[name]!r}, whose "
                    "value is already the device's tag of that name: rename the field or the level",
                )
        check_source_options(self.source_options(), self.source.options)
        columns = STANDARD_TYPES | {name: kind.strip().lower() for name, kind in fields.items()}
        for s, suite in enumerate(self.quality.suites):
            for e, expectation in enumerate(suite.expectations):
                if expectation.column not in columns:
                    raise ConfigError(
                        f"quality.suites[{s}].expectations[{e}].column",
                        f"unknown column {expectation.column!r}; known: {', '.join(sorted(columns))}",
                    )
                _check_column_type(
                    expectation, columns[expectation.column], f"quality.suites[{s}].expectations[{e}]"
                )

    @property
    def topic_filters(self) -> list[str]:
        """The filters the source reads: configured ones, or those of the telemetry and status templates and
        the Sparkplug B groups (bronze keeps their records; their own query reads them again)."""
        if self.source.topics:
            return list(self.source.topics)
        filters = [template.topic_filter for template, _ in self.payload.templates]
        filters = list(dict.fromkeys([*filters, *self.payload.sparkplug_filters]))
        status = self.gold.devices.status_template
        if status is not None and status.topic_filter not in filters:
            filters.append(status.topic_filter)
        return filters

    def source_options(self, topics: list[str] | None = None) -> dict[str, str]:
        """Options for ``spark.readStream.format("timestone")``, reading ``topics`` (default
        :attr:`topic_filters`)."""
        source = self.source
        where = (
            {"bootstrapServers": ",".join(source.bootstrap_servers)}
            if source.bootstrap_servers
            else {"brokers": ",".join(source.brokers)}
        )
        options = {
            **where,
            "topics": ",".join(self.topic_filters if topics is None else topics),
            "startingOffsets": self.source.starting_offsets,
            "failOnDataLoss": str(self.source.fail_on_data_loss).lower(),
        }
        if self.source.max_records_per_trigger is not None:
            options["maxRecordsPerTrigger"] = str(self.source.max_records_per_trigger)
        options.update(self.source.options)
        return options


SOURCE_OPTION_KEYS = {
    "brokers": "source.brokers",
    "bootstrapServers": "source.bootstrap_servers",
    "topics": "source.topics",
    "startingOffsets": "source.starting_offsets",
    "maxRecordsPerTrigger": "source.max_records_per_trigger",
    "failOnDataLoss": "source.fail_on_data_loss",
}
"""The config key behind each option the source is given; the others come from ``source.options``."""


def check_source_options(options: dict[str, str], passed: dict[str, str]) -> None:
    """Check the options as the ``timestone`` source will (it would refuse them only once Spark runs),
    and name the config key of a refused one."""
    try:
        parse_options(options)
    except SourceOptionError as exc:
        given = next((key for key in passed if key.lower() == exc.option.lower()), None)
        key = f"source.options.{given}" if given else SOURCE_OPTION_KEYS.get(exc.option, "source.options")
        raise ConfigError(key, str(exc).removeprefix("timestone source option ")) from None


def load_telemetry_config(data: Any, path: str = "telemetry") -> TelemetryConfig:
    """Build the config from the ``telemetry`` mapping of a parsed YAML file (None means all defaults)."""
    return load_dataclass(TelemetryConfig, data, path)


def load_telemetry_config_file(file: str | Path) -> TelemetryConfig:
    """Read ``file`` (e.g. ``conf/pipeline.yaml``) and build its ``telemetry`` section."""
    return load_telemetry_config(load_yaml_file(file).get("telemetry"))
