"""The telemetry pipeline's transformations: DataFrame in, DataFrame out, no I/O, no clock.

Everything the job does to rows lives here so that each step is tested on a small DataFrame built in the
test. Times that depend on when the job runs (``ingested_at``, ``updated_at``) are parameters, which also
makes a replayed micro-batch produce the same rows as its first attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines.timestamps import first_tick, last_tick
from sinks.tables import bronze_telemetry

from . import formats
from .config import DevicesConfig, PayloadConfig

#: Why a row went to quarantine (``telemetry_quarantine.reason``).
REASON_UNPARSEABLE = "unparseable_payload"
REASON_EXPECTATIONS = "failed_expectations"
#: The detail of a telemetry row whose topic's {device_id} level is empty.
NO_DEVICE = "topic: its {device_id} level is empty"

_RECORD_COLUMNS = (
    "broker",
    "topic",
    "offset",
    "timestamp",
    "client_id",
    "qos",
    "retain",
    "properties",
    "payload",
)


def to_bronze(records: DataFrame, ingested_at: datetime | Column) -> DataFrame:
    """Source records as bronze rows: unchanged, plus when and on which (UTC) date they were ingested.

    In the streaming query ``ingested_at`` is ``current_timestamp()``: the micro-batch's own time, which
    Spark keeps in the checkpoint, so a replayed batch stamps its rows as its first attempt did.

    Columns take the types ``sinks.tables`` declares for bronze. Bronze is partitioned by ingest date, not
    by the broker's or the device's clock: every micro-batch appends to one partition (today's), replays
    and backfills of old offsets cannot scatter small files into old partitions, and retention and
    reprocessing of the raw layer go by arrival, which is what it is for. Event-time questions are
    answered by silver, partitioned by ``event_date``.
    """
    stamp = (ingested_at if isinstance(ingested_at, Column) else F.lit(ingested_at)).cast("timestamp")
    schema = bronze_telemetry().schema
    return records.select(
        *[F.col(c).cast(schema[c].dataType).alias(c) for c in _RECORD_COLUMNS],
        F.to_date(stamp).alias("ingest_date"),
        stamp.alias("ingested_at"),
    )


#: The device times a timestamp can hold (years 0001 to 9999), per ``payload.event_time_unit``.
_TIME_RANGE = {
    "epoch_ms": (first_tick(1_000), last_tick(1_000)),
    "epoch_s": (first_tick(1), last_tick(1)),
}


def _device_time(payload: PayloadConfig) -> tuple[Column, Column] | None:
    """The device's time from ``payload.event_time_field`` and whether the field holds a value that is no
    time (out of the years 0001-9999, or an ISO-8601 string that does not parse); None without the field.

    Only a value in range is converted: Spark's ANSI mode fails the whole micro-batch on one overflowing
    conversion (``DATETIME_OVERFLOW``, ``CAST_OVERFLOW``), so a device whose clock counts nanoseconds would
    stop every device's telemetry. Such a row is quarantined as unparseable instead (:func:`parse_records`).
    """
    if payload.event_time_field is None:
        return None
    value = F.col(payload.event_time_field)
    unit = payload.event_time_unit
    if unit in _TIME_RANGE:
        low, high = _TIME_RANGE[unit]
        number = value.try_cast("double")
        in_range = number.between(low, high)
        if unit == "epoch_ms":
            device_time = F.when(in_range, F.timestamp_millis(value.try_cast("bigint")))
        else:
            device_time = F.when(in_range, F.timestamp_seconds(number))
    else:
        device_time = F.try_to_timestamp(value.cast("string"))
    return device_time, value.isNotNull() & device_time.isNull()


def _time_detail(payload: PayloadConfig) -> Column:
    """``parse_detail`` of a row whose time field holds no time."""
    return F.format_string(
        "field %s: %s is not a time in %s (years 0001 to 9999)",
        F.lit(payload.event_time_field),
        F.col(str(payload.event_time_field)).cast("string"),
        F.lit(payload.event_time_unit),
    )


def _event_time(device_time: Column | None) -> Column:
    """The device's time if the payload carries one, else the broker's append time, else ingestion time."""
    fallback = F.coalesce(F.col("timestamp"), F.col("ingested_at"))
    return fallback if device_time is None else F.coalesce(device_time, fallback)


#: Bronze's columns (:func:`to_bronze`).
BRONZE_COLUMNS = (*_RECORD_COLUMNS, "ingest_date", "ingested_at")
#: Whether a row of :func:`parse_records` is on a telemetry topic.
IS_TELEMETRY = "is_telemetry"
#: The columns of flagged :func:`parse_records` rows besides the payload fields (which must not clash).
PARSED_RECORD_COLUMNS = (
    *BRONZE_COLUMNS,
    IS_TELEMETRY,
    "topic_tags",
    "parse_error",
    "parse_detail",
    "failed_expectations",
)


def parse_records(bronze: DataFrame, payload: PayloadConfig) -> DataFrame:
    """Every bronze row, with ``is_telemetry`` and, on telemetry rows, the parsed columns: the device id
    from the topic, the topic's other placeholders as tags, the event time, the payload fields,
    ``parse_error`` and ``parse_detail`` (where a payload broke, when its format says).

    Rows on other topics (status topics, anything a wider filter brought in) keep null parsed columns: they
    are bronze only (and the devices table's status rows). The payload is read in its topic template's
    format (:func:`.formats.decoded_payload`); everything after this step is the same for every format.
    """
    telemetry = formats.is_telemetry(payload)
    read = bronze.select("*", *formats.payload_readings(payload))
    time_fields = formats.time_readings(payload)
    read = read.select("*", *time_fields) if time_fields else read
    decoded = read.withColumn("_decoded", formats.decoded_payload(payload))
    error, detail = F.col("_decoded").getField(formats.ERROR), F.col("_decoded").getField(formats.DETAIL)
    times = _device_time(payload)
    if times is not None:
        no_time = times[1] & ~F.coalesce(error, F.lit(False))
        error = error | no_time
        detail = F.when(no_time, _time_detail(payload)).otherwise(detail)
    device = formats.device_id(payload)
    no_device = device == ""  # devices//telemetry: read by the template's filter, naming no device
    error = error | no_device
    detail = F.when(no_device, F.lit(NO_DEVICE)).otherwise(detail)
    parsed = [
        ("device_id", device),
        ("topic_tags", formats.topic_tags(payload)),
        ("event_time", _event_time(None if times is None else times[0])),
        *[(name, F.col(name)) for name in payload.fields],
        ("parse_error", error),
        ("parse_detail", detail),
    ]
    fields = [F.col("_decoded").getField(name).alias(name) for name in payload.fields]
    return decoded.select(*bronze.columns, *fields, "_decoded").select(
        *bronze.columns,
        telemetry.alias(IS_TELEMETRY),
        *[F.when(telemetry, column).alias(name) for name, column in parsed],
    )


def parse_telemetry(bronze: DataFrame, payload: PayloadConfig) -> DataFrame:
    """:func:`parse_records`' rows on telemetry topics."""
    return parse_records(bronze, payload).where(F.col(IS_TELEMETRY))


def flag_failures(parsed: DataFrame, failure_conditions: Mapping[str, Column]) -> DataFrame:
    """Add ``failed_expectations``: the names of the expectations each row violates (empty when none).

    ``failure_conditions`` maps an expectation's name to a boolean column that is true when a row
    violates it (see ``quality.row_failure_conditions``). An unparseable row fails by itself, whatever
    the expectations say, and is not evaluated against them.
    """
    failed = [F.when(condition, F.lit(name)) for name, condition in failure_conditions.items()]
    names = F.array_compact(F.array(*failed)) if failed else F.array().cast("array<string>")
    return parsed.withColumn(
        "failed_expectations",
        F.when(F.col("parse_error"), F.array().cast("array<string>")).otherwise(names),
    )


def is_quarantined() -> Column:
    return F.col("parse_error") | (F.size("failed_expectations") > 0)


def to_quarantine(
    flagged: DataFrame, payload: PayloadConfig, run_id: str, batch_id: int, quarantined_at: datetime
) -> DataFrame:
    """Telemetry rows that failed parsing or an expectation, raw payload kept, with the reason and, for a
    payload that could not be read, the detail: the field or byte offset where it broke."""
    stamp = F.lit(quarantined_at).cast("timestamp")
    rejected = quarantined_rows(flagged)
    return rejected.select(
        "broker",
        "topic",
        "offset",
        "timestamp",
        "client_id",
        "properties",
        "payload",
        F.when(F.col("device_id") != "", F.col("device_id")).alias("device_id"),
        F.when(F.col("parse_error"), F.lit(None).cast("array<string>"))
        .otherwise(F.col("failed_expectations"))
        .alias("failed_expectations"),
        F.when(F.col("parse_error"), F.lit(REASON_UNPARSEABLE))
        .otherwise(F.lit(REASON_EXPECTATIONS))
        .alias("reason"),
        F.coalesce("parse_detail", formats.json_detail(payload, F.col("parse_error"))).alias("detail"),
        F.lit(run_id).alias("run_id"),
        F.lit(batch_id).cast("bigint").alias("batch_id"),
        F.to_date(stamp).alias("quarantine_date"),
        stamp.alias("quarantined_at"),
    )


def passed_rows(flagged: DataFrame) -> DataFrame:
    """Telemetry rows that parsed and met every expectation: the candidates for silver."""
    return flagged.where(F.col(IS_TELEMETRY) & ~is_quarantined())


def quarantined_rows(flagged: DataFrame) -> DataFrame:
    """Telemetry rows that failed parsing or an expectation."""
    return flagged.where(F.col(IS_TELEMETRY) & is_quarantined())


def to_silver(rows: DataFrame, silver_fields: Sequence[str]) -> DataFrame:
    """Silver's columns: identity, device, event time and its date, and the payload fields."""
    return rows.select(
        "device_id",
        "event_time",
        F.to_date("event_time").alias("event_date"),
        "topic",
        "broker",
        "offset",
        "ingested_at",
        *silver_fields,
    )


def profile_aggregates(duplicate: str) -> list[Column]:
    """Aggregates over a batch's flagged rows that tell the job which writes it needs.

    ``passed`` / ``quarantined`` telemetry rows (:data:`REASON_UNPARSEABLE`: those that could not be read),
    and ``duplicates``: passed rows whose boolean column
    ``duplicate`` says they repeat a message silver has (a write with no rows is skipped).
    """
    telemetry = F.col(IS_TELEMETRY)
    passed = telemetry & ~is_quarantined()
    return [
        F.count(F.when(passed, 1)).alias("passed"),
        F.count(F.when(telemetry & is_quarantined(), 1)).alias("quarantined"),
        F.count(F.when(telemetry & F.col("parse_error"), 1)).alias(REASON_UNPARSEABLE),
        F.count(F.when(passed & F.col(duplicate), 1)).alias("duplicates"),
    ]


def minute_increments(silver_rows: DataFrame, metrics: Sequence[str], updated_at: datetime) -> DataFrame:
    """Per device and minute of event time of a batch's silver rows: the message count and, of each metric,
    min, max, average and how many rows had a value (``<metric>_count``).

    What :func:`minute_merge_set` adds to a stored minute, so ``device_minute`` is kept up to date from each
    batch's own rows, without reading silver back: a batch's share of a minute merges into the minute's
    stored row (its first share inserts the row), and late data simply adds to its minute.
    """
    stats = []
    for metric in metrics:
        value = F.col(metric).cast("double")
        stats += [F.min(value).alias(f"{metric}_min"), F.max(value).alias(f"{metric}_max")]
        stats += [F.avg(value).alias(f"{metric}_avg"), F.count(value).alias(f"{metric}_count")]
    grouped = silver_rows.groupBy("device_id", F.date_trunc("minute", "event_time").alias("minute"))
    rows = grouped.agg(F.count(F.lit(1)).alias("count"), *stats)
    return rows.select(
        "device_id",
        "minute",
        F.to_date("minute").alias("event_date"),
        "count",
        *[f"{metric}_{stat}" for metric in metrics for stat in ("min", "max", "avg")],
        F.lit(updated_at).cast("timestamp").alias("updated_at"),
        *[f"{metric}_count" for metric in metrics],
    )


#: What ``device_minute`` holds of each metric.
MINUTE_STATS = ("min", "max", "avg", "count")


def minute_merge_set(metrics: Sequence[str]) -> dict[str, str]:
    """The ``device_minute`` merge's update: a stored minute (``t``) plus a batch's share of it (``s``).

    Counts add up; a minimum or maximum is the lower or higher of the two, NaN above every number as Spark's
    ``min``/``max`` order it (spelt out: DataFusion's ``greatest`` does not); an average is the two averages
    weighted by how many values each had. A side without values (null) leaves the other's. A row written
    before ``<metric>_count`` existed counts as many values as messages. Plain SQL both backends read alike.
    """
    updates = {"count": "t.`count` + s.`count`", "updated_at": "s.`updated_at`"}
    for metric in metrics:
        low, high, avg, count = (f"`{metric}_{stat}`" for stat in MINUTE_STATS)
        stored = f"coalesce(t.{count}, t.`count`)"
        updates[f"{metric}_min"] = (
            f"CASE WHEN isnan(t.{low}) THEN coalesce(s.{low}, t.{low}) "
            f"WHEN isnan(s.{low}) THEN coalesce(t.{low}, s.{low}) "
            f"ELSE coalesce(least(t.{low}, s.{low}), t.{low}, s.{low}) END"
        )
        updates[f"{metric}_max"] = (
            f"CASE WHEN isnan(t.{high}) THEN t.{high} WHEN isnan(s.{high}) THEN s.{high} "
            f"ELSE coalesce(greatest(t.{high}, s.{high}), t.{high}, s.{high}) END"
        )
        updates[f"{metric}_avg"] = (
            f"CASE WHEN t.{avg} IS NULL THEN s.{avg} WHEN s.{avg} IS NULL THEN t.{avg} "
            f"ELSE (t.{avg} * {stored} + s.{avg} * s.{count}) / ({stored} + s.{count}) END"
        )
        updates[f"{metric}_count"] = f"{stored} + s.{count}"
    return updates


def parse_status(bronze: DataFrame, devices: DevicesConfig) -> DataFrame:
    """Status-topic rows reduced to what ``devices`` needs: device, broker time, broker, firmware."""
    template = devices.status_template
    if template is None:
        raise ValueError("parse_status needs gold.devices.status_topic_template")
    firmware = formats.json_string(F.col("payload").cast("string"), devices.status_firmware_field)
    device = formats.placeholder(template, "device_id")
    return bronze.where(formats.matches(template) & (device != "")).select(
        device.alias("device_id"),
        "timestamp",
        "broker",
        firmware.alias("firmware_version"),
        F.lit(None).cast("string").alias("group"),
        formats.tags(template).alias("tags"),
    )


def telemetry_sightings(silver_rows: DataFrame, devices: DevicesConfig) -> DataFrame:
    """Silver rows reduced to the columns ``device_updates`` takes (one per message)."""
    tags = F.col("topic_tags")
    if devices.tag_fields:
        fields = F.create_map(*[p for n in devices.tag_fields for p in (F.lit(n), F.col(n).cast("string"))])
        tags = F.map_concat(tags, fields)
    field_or_null = lambda name: F.col(name).cast("string") if name else F.lit(None).cast("string")  # noqa: E731
    return silver_rows.select(
        "device_id",
        "timestamp",
        "broker",
        field_or_null(devices.firmware_field).alias("firmware_version"),
        field_or_null(devices.group_field).alias("group"),
        tags.alias("tags"),
    )


def device_updates(sightings: DataFrame, updated_at: datetime) -> DataFrame:
    """One ``devices`` row per device seen in the batch: its latest broker time and latest known attributes.

    ``last_seen`` is the broker's append time (a clock the platform trusts, unlike a device's). Firmware,
    group and tags are the latest non-null values in the batch; null when the batch carried none, and the
    merge keeps the stored value then.
    """
    seen = F.col("timestamp")

    def latest(name: str) -> Column:
        return F.max_by(name, F.when(F.col(name).isNotNull(), seen)).alias(name)

    non_empty_tags = F.when(F.size("tags") > 0, F.col("tags"))
    return (
        sightings.where(F.col("device_id").isNotNull() & (F.col("device_id") != "") & seen.isNotNull())
        .withColumn("tags", non_empty_tags)
        .groupBy("device_id")
        .agg(
            F.max(seen).alias("last_seen"),
            F.max_by("broker", seen).alias("broker"),
            latest("firmware_version"),
            latest("tags"),
            latest("group"),
        )
        .select(
            "device_id",
            "last_seen",
            "broker",
            "firmware_version",
            "tags",
            "group",
            F.lit(updated_at).cast("timestamp").alias("updated_at"),
        )
    )


#: ``devices`` attributes a batch may lack (null): a merge keeps the stored value for them.
KEPT_DEVICE_ATTRIBUTES = ("firmware_version", "tags", "group", "online", "last_birth")


def device_update_set(columns: Sequence[str]) -> dict[str, str]:
    """The ``devices`` merge's update: every column from the batch, the attributes it lacks kept.

    Plain SQL both backends read alike (``coalesce``), so the stored table need not be joined first.
    """
    return {c: f"coalesce(s.`{c}`, t.`{c}`)" if c in KEPT_DEVICE_ATTRIBUTES else f"s.`{c}`" for c in columns}
