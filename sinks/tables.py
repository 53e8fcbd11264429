"""Every Delta table of Timestone, declared once: schema, partitioning, properties, merge keys, location.

Pipelines, stores, tests and docs all read these specs; nothing else spells out a column list. Schemas are
Spark ``StructType`` objects (built in Python, because parsing DDL needs a running JVM) and the pyarrow schema
used by delta-rs is derived from them, so the two can never drift apart.

The silver payload columns (and the per-metric columns of ``device_minute`` that aggregate them) come from
configuration: :func:`build_catalog` takes them as data and returns a :class:`TableCatalog` with those tables
extended. ``DEFAULT_CATALOG`` is the catalog of the default telemetry pipeline: :data:`DEFAULT_PAYLOAD_FIELDS`
and :data:`DEFAULT_MINUTE_METRICS`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NumericType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sinks.spark_arrow import to_arrow

CHANGE_DATA_FEED = {"delta.enableChangeDataFeed": "true"}

#: Values of ``action_executions.state`` (the state machine lives in ``pipelines.actions.states``);
#: ``action_summary`` has one ``<state in lower case>_count`` column per state.
EXECUTION_STATES: tuple[str, ...] = (
    "QUEUED",
    "IN_PROGRESS",
    "SUCCEEDED",
    "FAILED",
    "TIMED_OUT",
    "REJECTED",
    "CANCELED",
    "EXPIRED",
)
#: States added after ``action_summary`` existed: their counts are nullable columns at its end (a table is
#: given the columns it lacks, and a NOT NULL one cannot be added), null in rows from before them (0).
LATER_STATES: tuple[str, ...] = ("EXPIRED",)

#: Values of ``action_summary.action_state`` (SCHEDULED: waiting for ``schedule.start_at``; REJECTED: the row
#: was not a valid action, nothing was sent).
ACTION_STATES: tuple[str, ...] = ("SCHEDULED", "IN_PROGRESS", "COMPLETED", "ABORTED", "CANCELED", "REJECTED")

#: Silver payload columns used when no configuration names them: what the default telemetry pipeline writes
#: (``payload.fields`` of conf/pipeline.yaml but ``ts``, which becomes ``event_time``; the simulated fleet
#: sends these). ``tests/e2e/sinks/test_tables_doc.py`` keeps them equal to the pipeline's defaults.
DEFAULT_PAYLOAD_FIELDS: dict[str, str] = {
    "seq": "bigint",
    "temperature": "double",
    "humidity": "double",
    "battery": "double",
    "firmware": "string",
    "group": "string",
}

#: ``device_minute`` metrics used when no configuration names them: the default pipeline's
#: ``gold.minute_metrics``.
DEFAULT_MINUTE_METRICS: tuple[str, ...] = ("temperature", "humidity", "battery")

_SIMPLE_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "binary": BinaryType(),
    "boolean": BooleanType(),
    "tinyint": ByteType(),
    "byte": ByteType(),
    "smallint": ShortType(),
    "short": ShortType(),
    "int": IntegerType(),
    "integer": IntegerType(),
    "bigint": LongType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
}

_COLUMN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class UnknownTable(KeyError):
    """A table name that the catalog does not declare; the message lists the names it does."""

    def __str__(self) -> str:
        return str(self.args[0])


def column(name: str, data_type: DataType, nullable: bool = True, comment: str | None = None) -> StructField:
    """One column; ``comment`` ends up in the Spark field metadata and in docs/tables.md."""
    metadata = {"comment": comment} if comment else {}
    return StructField(name, data_type, nullable, metadata)


def struct(*fields: StructField) -> StructType:
    return StructType(list(fields))


STRING_MAP = MapType(StringType(), StringType(), valueContainsNull=True)


@dataclass(frozen=True)
class TableSpec:
    """The declaration of one Delta table.

    ``merge_keys`` are the columns that identify a row; stores use them as the default merge condition and
    the pipelines rely on them being unique per micro-batch (Delta rejects a merge where two source rows
    match one target row).
    """

    name: str
    schema: StructType
    description: str
    partition_by: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    merge_keys: tuple[str, ...] = ()
    cluster_by: str | None = None
    """A column whose values each data file should hold few of (see :mod:`sinks.clustering`): reads and
    merges filtered on it then open few files. Writes sort their rows by it; compaction clusters by it."""

    def __post_init__(self) -> None:
        names = self.column_names
        if self.cluster_by is not None and (self.cluster_by not in names or self.partition_by):
            raise ValueError(f"table {self.name}: cluster_by must name a column of an unpartitioned table")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"table {self.name}: duplicate columns {duplicates}")
        for label, columns in (("partition_by", self.partition_by), ("merge_keys", self.merge_keys)):
            missing = [c for c in columns if c not in names]
            if missing:
                raise ValueError(f"table {self.name}: {label} names unknown columns {missing}")

    @property
    def column_names(self) -> list[str]:
        return [f.name for f in self.schema.fields]

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """The pyarrow schema delta-rs writes; timestamps are microseconds in UTC, as Delta stores them.

        Column comments travel as the Delta field metadata key ``comment``, which Spark shows as the comment.
        """
        bare = StructType([StructField(f.name, f.dataType, f.nullable) for f in self.schema.fields])
        arrow = to_arrow(bare)
        return pa.schema(
            [
                field.with_metadata({"comment": spark_field.metadata["comment"]})
                if spark_field.metadata.get("comment")
                else field
                for field, spark_field in zip(arrow, self.schema.fields, strict=True)
            ]
        )

    @property
    def read_schema(self) -> StructType:
        """The schema Spark file reads produce: the declared columns and types, every field nullable."""
        nullable = as_nullable(self.schema)
        assert isinstance(nullable, StructType)
        return nullable

    @property
    def change_data_feed(self) -> bool:
        return self.properties.get("delta.enableChangeDataFeed", "false").lower() == "true"

    def location(self, root: str) -> str:
        """Where the table lives under a root directory or URI (``/data/lake``, ``s3://bucket/lake``)."""
        return f"{root.rstrip('/')}/{self.name}"

    def qualified_name(self, namespace: str) -> str:
        """The table's name in a metastore or Unity Catalog namespace (``catalog.schema``)."""
        return f"{namespace}.{self.name}" if namespace else self.name

    def with_columns(self, extra: Sequence[StructField]) -> TableSpec:
        """This spec with ``extra`` columns appended (schemas only grow: stores add them to old tables)."""
        return replace(self, schema=StructType([*self.schema.fields, *extra]))


def as_nullable(data_type: DataType) -> DataType:
    """``data_type`` with every nested field, element and value nullable (what parquet reads yield)."""
    if isinstance(data_type, StructType):
        return StructType(
            [StructField(f.name, as_nullable(f.dataType), True, f.metadata) for f in data_type.fields]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(as_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(as_nullable(data_type.keyType), as_nullable(data_type.valueType), True)
    return data_type


class TableCatalog(Mapping[str, TableSpec]):
    """The set of table specs a deployment uses, looked up by name."""

    def __init__(self, specs: Sequence[TableSpec]) -> None:
        self._specs = {spec.name: spec for spec in specs}
        if len(self._specs) != len(specs):
            raise ValueError("two table specs share a name")

    def __getitem__(self, name: str) -> TableSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownTable(f"unknown table {name!r}; declared tables: {sorted(self._specs)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def spec(self, name: str) -> TableSpec:
        return self[name]

    def location(self, name: str, root: str) -> str:
        return self[name].location(root)

    def replace(self, spec: TableSpec) -> TableCatalog:
        """A catalog where ``spec`` takes the place of the spec of the same name (or is added)."""
        specs = dict(self._specs)
        specs[spec.name] = spec
        return TableCatalog(list(specs.values()))


def parse_fields(
    fields: Mapping[str, str | DataType] | Sequence[StructField], where: str
) -> list[StructField]:
    """Turn configured columns into nullable Spark fields.

    Configuration gives ``{name: type}`` with simple type names (``double``, ``string``, ``bigint``, ...) or
    Spark ``DataType`` objects for nested types; errors name the offending field (``where.name``).
    """
    if not isinstance(fields, Mapping):
        return [StructField(f.name, f.dataType, True, f.metadata) for f in fields]
    parsed = []
    for name, type_ in fields.items():
        if not _COLUMN_NAME.match(name):
            raise ValueError(f"{where}.{name}: not a valid column name")
        data_type = type_ if isinstance(type_, DataType) else _SIMPLE_TYPES.get(str(type_).strip().lower())
        if data_type is None:
            raise ValueError(
                f"{where}.{name}: unknown type {type_!r}; expected one of {sorted(_SIMPLE_TYPES)}"
                " or a pyspark DataType"
            )
        parsed.append(StructField(name, data_type, True))
    return parsed


def bronze_telemetry() -> TableSpec:
    return TableSpec(
        name="bronze_telemetry",
        description="Every persisted MQTT message as read from the brokers' commitlogs, unparsed.",
        schema=struct(
            column("broker", StringType(), False, "broker id the record was read from"),
            column("topic", StringType(), False),
            column("offset", LongType(), False, "dense per-topic commitlog offset"),
            column("timestamp", TimestampType(), True, "broker append time"),
            column("client_id", StringType()),
            column("qos", ByteType()),
            column("retain", BooleanType()),
            column("properties", STRING_MAP, True, "MQTT 5 user properties"),
            column("payload", BinaryType()),
            column("ingest_date", DateType(), False, "date of ingested_at (UTC), the partition"),
            column("ingested_at", TimestampType(), False),
        ),
        partition_by=("ingest_date",),
        properties=CHANGE_DATA_FEED,
        merge_keys=("broker", "topic", "offset"),
    )


def silver_telemetry(payload_fields: Sequence[StructField]) -> TableSpec:
    base = TableSpec(
        name="silver_telemetry",
        description="Telemetry parsed from the payload, one row per (broker, topic, offset), deduplicated.",
        schema=struct(
            column("device_id", StringType(), False),
            column("event_time", TimestampType(), False, "device time if sent, else broker time"),
            column("event_date", DateType(), False, "date of event_time (UTC), the partition"),
            column("topic", StringType(), False),
            column("broker", StringType(), False),
            column("offset", LongType(), False),
            column("ingested_at", TimestampType(), False),
        ),
        partition_by=("event_date",),
        properties=CHANGE_DATA_FEED,
        merge_keys=("broker", "topic", "offset"),
    )
    return base.with_columns(payload_fields)


def telemetry_quarantine() -> TableSpec:
    return TableSpec(
        name="telemetry_quarantine",
        description="Bronze rows that failed parsing or an expectation, kept raw with the reason.",
        schema=struct(
            column("broker", StringType(), False),
            column("topic", StringType(), False),
            column("offset", LongType(), False),
            column("timestamp", TimestampType()),
            column("client_id", StringType()),
            column("properties", STRING_MAP),
            column("payload", BinaryType()),
            column("device_id", StringType(), True, "null when it could not be derived"),
            column("failed_expectations", ArrayType(StringType(), True), True),
            column("reason", StringType(), False),
            column("detail", StringType(), True, "what could not be read: the field, byte offset or alias"),
            column("run_id", StringType()),
            column("batch_id", LongType()),
            column("quarantine_date", DateType(), False, "date of quarantined_at (UTC), the partition"),
            column("quarantined_at", TimestampType(), False),
        ),
        partition_by=("quarantine_date",),
        merge_keys=("broker", "topic", "offset"),
    )


def dq_results() -> TableSpec:
    return TableSpec(
        name="dq_results",
        description="One row per expectation per validated micro-batch.",
        schema=struct(
            column("run_id", StringType(), False, "streaming query id"),
            column("batch_id", LongType(), False),
            column("suite", StringType(), False),
            column("expectation", StringType(), False, "expectation type and its column"),
            column("column", StringType()),
            column("success", BooleanType(), False),
            column("element_count", LongType()),
            column("unexpected_count", LongType()),
            column("observed_value", StringType(), True, "JSON"),
            column("observed_at", TimestampType(), False),
        ),
        merge_keys=("run_id", "batch_id", "suite", "expectation"),
    )


def device_minute(metrics: Sequence[str]) -> TableSpec:
    metric_columns = [
        column(f"{metric}_{stat}", DoubleType()) for metric in metrics for stat in ("min", "max", "avg")
    ]
    value_counts = [
        column(f"{metric}_count", LongType(), True, f"messages of the minute with a {metric} value")
        for metric in metrics
    ]
    return TableSpec(
        name="device_minute",
        description=(
            "Per device and minute: message count, min/max/avg of every numeric payload field and how many "
            "messages had a value."
        ),
        schema=struct(
            column("device_id", StringType(), False),
            column("minute", TimestampType(), False, "start of the minute (UTC)"),
            column("event_date", DateType(), False, "date of minute, the partition"),
            column("count", LongType(), False),
            *metric_columns,
            column("updated_at", TimestampType()),
            *value_counts,
        ),
        partition_by=("event_date",),
        merge_keys=("device_id", "minute"),
    )


def devices() -> TableSpec:
    return TableSpec(
        name="devices",
        description="The device registry: one row per device, last seen state and targeting attributes.",
        schema=struct(
            column("device_id", StringType(), False),
            column("last_seen", TimestampType()),
            column("broker", StringType()),
            column("firmware_version", StringType()),
            column("tags", STRING_MAP),
            column("group", StringType(), True, "OTA target group"),
            column("updated_at", TimestampType()),
            column("online", BooleanType(), True, "Sparkplug B: whether its birth is in force"),
            column("last_birth", TimestampType(), True, "Sparkplug B: its latest birth's time"),
        ),
        merge_keys=("device_id",),
    )


def actions() -> TableSpec:
    return TableSpec(
        name="actions",
        description="Operator actions (OTA updates and commands); the fanout streams its change data feed.",
        schema=struct(
            column("id", StringType(), False),
            column("kind", StringType(), False, "ota | command"),
            column(
                "target",
                struct(
                    column("device_ids", ArrayType(StringType(), True)),
                    column("group", StringType()),
                    column("all", BooleanType()),
                ),
                False,
            ),
            column(
                "payload",
                struct(
                    column("version", StringType()),
                    column("url", StringType()),
                    column("sha256", StringType()),
                    column("size", LongType()),
                    column("command", StringType()),
                    column("args", STRING_MAP),
                ),
            ),
            column(
                "rollout", struct(column("max_per_minute", IntegerType()), column("broadcast", BooleanType()))
            ),
            column(
                "abort_criteria",
                struct(column("failure_pct", DoubleType()), column("min_executed", IntegerType())),
            ),
            column("in_progress_timeout_s", IntegerType()),
            column("created_by", StringType()),
            column("created_at", TimestampType(), False),
            column("cancel", BooleanType(), False),
            column("updated_at", TimestampType()),
            # Columns added later than the ones above: a table written before them reads them as null, the
            # defaults (``ensure`` adds them; docs/ota.md says what each null means).
            column(
                "exponential_rate",
                struct(
                    column("base_per_minute", IntegerType()),
                    column("increment_factor", DoubleType()),
                    column("notified_devices", IntegerType()),
                    column("succeeded_devices", IntegerType()),
                ),
                True,
                "rate grows by increment_factor every notified_devices (or succeeded_devices) devices, "
                "up to rollout.max_per_minute",
            ),
            column(
                "phases",
                ArrayType(
                    struct(
                        column("percent", DoubleType()),
                        column("devices", IntegerType()),
                        column("wait_s", LongType()),
                        column("success_pct", DoubleType()),
                    ),
                    True,
                ),
                True,
                "a share of the target each (the last takes the rest); wait_s and success_pct gate the next",
            ),
            column(
                "abort_rules",
                ArrayType(
                    struct(
                        column("failure_kind", StringType()),
                        column("threshold_pct", DoubleType()),
                        column("min_executed", IntegerType()),
                    ),
                    True,
                ),
                True,
                "failure_kind: failed | rejected | timed_out | any",
            ),
            column(
                "rollback",
                struct(
                    column("version", StringType()),
                    column("url", StringType()),
                    column("sha256", StringType()),
                    column("size", LongType()),
                ),
                True,
                "the firmware an abort sends back to the devices that installed this one",
            ),
            column(
                "retries",
                ArrayType(
                    struct(
                        column("failure_kind", StringType()),
                        column("max_retries", IntegerType()),
                        column("backoff_s", LongType()),
                        column("backoff_factor", DoubleType()),
                    ),
                    True,
                ),
                True,
                "failure_kind: failed | timed_out | any",
            ),
            column(
                "schedule",
                struct(
                    column("start_at", TimestampType()),
                    column("end_at", TimestampType()),
                    column("end_behavior", StringType()),
                ),
                True,
                "end_behavior: stop | cancel",
            ),
            column(
                "maintenance_windows",
                ArrayType(
                    struct(
                        column("days", ArrayType(StringType(), True)),
                        column("start", StringType()),
                        column("duration_min", IntegerType()),
                        column("time_zone", StringType()),
                    ),
                    True,
                ),
                True,
                "days: null (daily) or mon..sun; start HH:MM in time_zone (IANA)",
            ),
            column("continuous", BooleanType(), True, "devices joining the target group later get it too"),
        ),
        properties=CHANGE_DATA_FEED,
        merge_keys=("id",),
    )


def action_executions() -> TableSpec:
    return TableSpec(
        name="action_executions",
        description="One row per (action, device): the execution state machine, versioned per row.",
        schema=struct(
            column("action_id", StringType(), False),
            column("device_id", StringType(), False),
            column("state", StringType(), False, " | ".join(EXECUTION_STATES)),
            column("version", LongType(), False, "increases with every change of the row"),
            column("report_seq", LongType(), False, "highest device report sequence applied (0: none)"),
            column("status_details", StringType()),
            column("queued_at", TimestampType()),
            column("updated_at", TimestampType(), False),
            column("published_at", TimestampType(), True, "when the action message went out to the device"),
            column("started_at", TimestampType()),
            column("finished_at", TimestampType()),
            column(
                "attempt", IntegerType(), True, "1, then one more per retry (null in rows before retries: 1)"
            ),
            column("phase", IntegerType(), True, "the rollout phase of the device, from 1 (null: no phases)"),
            column("retry_at", TimestampType(), True, "when a retry is due (a QUEUED row after a failure)"),
            column(
                "expires_at",
                TimestampType(),
                True,
                "when the message last sent to the device expires (null: sent before this column)",
            ),
            column(
                "sending_at",
                TimestampType(),
                True,
                "when a tick or a fan-out marked the row as being sent, before publishing (null once "
                "recorded as sent)",
            ),
        ),
        properties=CHANGE_DATA_FEED,
        merge_keys=("action_id", "device_id"),
        cluster_by="action_id",
    )


def action_summary() -> TableSpec:
    return TableSpec(
        name="action_summary",
        description="Per action: executions counted by state, and the action's overall state.",
        schema=struct(
            column("action_id", StringType(), False),
            *(
                column(f"{state.lower()}_count", LongType(), False)
                for state in EXECUTION_STATES
                if state not in LATER_STATES
            ),
            column("total_count", LongType(), False),
            column("action_state", StringType(), False, " | ".join(ACTION_STATES)),
            column("updated_at", TimestampType(), False),
            column(
                "reason",
                StringType(),
                True,
                "why the action ended other than completed: the field a rejected row got wrong, the abort "
                "threshold crossed, a cancel, the schedule's end",
            ),
            column("aborted_by", StringType(), True, "the abort criterion that fired (abort_rules[2])"),
            column("rollback_action_id", StringType(), True, "the action written to roll back an abort"),
            column("phase", IntegerType(), True, "the rollout phase devices are being sent now, from 1"),
            column("retries_count", LongType(), True, "retries sent or due, over every device"),
            column(
                "expired_count",
                LongType(),
                True,
                "devices whose action message expired before they took it (null in rows written before "
                "the state existed: 0)",
            ),
            column(
                "accepted_payload",
                StringType(),
                True,
                "the kind and payload the job took the action in with (JSON): what it sends, whatever the "
                "row says later",
            ),
            column(
                "payload_change",
                StringType(),
                True,
                "a change of the row's kind or payload after the job took the action in, refused "
                "(null: none)",
            ),
        ),
        merge_keys=("action_id",),
    )


def fleet_compliance() -> TableSpec:
    return TableSpec(
        name="fleet_compliance",
        description="Per group: devices by installed firmware version against the one desired for the group.",
        schema=struct(
            column("group", StringType(), False, "the devices' group (devices.group; '' for none)"),
            column("installed_version", StringType(), False, "what the devices run ('unknown': not known)"),
            column("devices", LongType(), False),
            column(
                "desired_version",
                StringType(),
                True,
                "of the group's latest OTA action that was not aborted, canceled or rejected (null: none)",
            ),
            column("desired_action_id", StringType()),
            column("on_desired", BooleanType(), False, "installed_version is desired_version"),
            column("updated_at", TimestampType(), False),
        ),
        merge_keys=("group", "installed_version"),
    )


def build_catalog(
    payload_fields: Mapping[str, str | DataType] | Sequence[StructField] | None = None,
    minute_metrics: Sequence[str] | None = None,
) -> TableCatalog:
    """All tables, with the silver payload columns and device_minute metrics taken from configuration
    (without them, the default pipeline's; metrics default to every numeric payload field otherwise)."""
    fields = parse_fields(
        DEFAULT_PAYLOAD_FIELDS if payload_fields is None else payload_fields, "payload_fields"
    )
    if minute_metrics is None:
        minute_metrics = DEFAULT_MINUTE_METRICS if payload_fields is None else None
    numeric = [f.name for f in fields if isinstance(f.dataType, NumericType)]
    metrics = list(minute_metrics) if minute_metrics is not None else numeric
    return TableCatalog(
        [
            bronze_telemetry(),
            silver_telemetry(fields),
            telemetry_quarantine(),
            dq_results(),
            device_minute(metrics),
            devices(),
            actions(),
            action_executions(),
            action_summary(),
            fleet_compliance(),
        ]
    )


DEFAULT_CATALOG: TableCatalog = build_catalog()


def table_spec(name: str) -> TableSpec:
    """The spec of ``name`` in the default catalog (pipelines with configured payloads use their own)."""
    return DEFAULT_CATALOG[name]
