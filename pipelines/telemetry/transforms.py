"""The telemetry pipeline's transformations: DataFrame in, DataFrame out, no I/O, no clock.

Everything the job does to rows lives here so that each step is tested on a small DataFrame built in the
test. Times that depend on when the job runs (``ingested_at``, ``updated_at``) are parameters, which also
makes a replayed micro-batch produce the same rows as its first attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sinks.tables import bronze_telemetry

from .config import DevicesConfig, PayloadConfig, TopicTemplate

#: Why a row went to quarantine (``telemetry_quarantine.reason``).
REASON_UNPARSEABLE = "unparseable_payload"
REASON_EXPECTATIONS = "failed_expectations"

_CORRUPT = "_corrupt_record"
#: What identifies a record in a batch (and in a table).
_RECORD_KEY = ["broker", "topic", "offset"]
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


def to_bronze(records: DataFrame, ingested_at: datetime) -> DataFrame:
    """Source records as bronze rows: unchanged, plus when and on which (UTC) date they were ingested.

    Columns take the types ``sinks.tables`` declares for bronze. Bronze is partitioned by ingest date, not
    by the broker's or the device's clock: every micro-batch appends to one partition (today's), replays
    and backfills of old offsets cannot scatter small files into old partitions, and retention and
    reprocessing of the raw layer go by arrival, which is what it is for. Event-time questions are
    answered by silver, partitioned by ``event_date``.
    """
    stamp = F.lit(ingested_at).cast("timestamp")
    schema = bronze_telemetry().schema
    return records.select(
        *[F.col(c).cast(schema[c].dataType).alias(c) for c in _RECORD_COLUMNS],
        F.to_date(stamp).alias("ingest_date"),
        stamp.alias("ingested_at"),
    )


def topic_matches(template: TopicTemplate) -> Column:
    return F.col("topic").rlike(template.regex)


def _placeholder(template: TopicTemplate, name: str) -> Column:
    return F.regexp_extract(F.col("topic"), template.regex, template.placeholders.index(name) + 1)


def _topic_tags(template: TopicTemplate) -> Column:
    """Placeholders other than the device id (``sites/{site}/...``) as a string map, for ``devices.tags``."""
    others = [name for name in template.placeholders if name != "device_id"]
    if not others:
        return F.create_map().cast("map<string,string>")
    return F.create_map(*[item for name in others for item in (F.lit(name), _placeholder(template, name))])


def _event_time(payload: PayloadConfig) -> Column:
    """The device's time if the payload carries it, else the broker's append time, else ingestion time."""
    fallback = F.coalesce(F.col("timestamp"), F.col("ingested_at"))
    if payload.event_time_field is None:
        return fallback
    value = F.col("_json").getField(payload.event_time_field)
    if payload.event_time_unit == "epoch_ms":
        device_time = F.timestamp_millis(value.cast("bigint"))
    elif payload.event_time_unit == "epoch_s":
        device_time = F.timestamp_seconds(value)
    else:
        device_time = F.try_to_timestamp(value.cast("string"))
    return F.coalesce(device_time, fallback)


def parse_telemetry(bronze: DataFrame, payload: PayloadConfig) -> DataFrame:
    """Bronze rows on telemetry topics, parsed: device id from the topic, payload fields, event time.

    Rows on other topics (status topics, anything a wider filter brought in) are left out: they stay in
    bronze. A payload that is not a JSON object of the declared types keeps null fields and is flagged
    ``parse_error``; the payload columns come from ``payload.fields`` in their declared types.
    """
    parsed = bronze.where(topic_matches(payload.template)).withColumn("_json", _payload_json(payload))
    parsed_columns = [column.alias(name) for name, column in _parsed_columns(payload)]
    return parsed.select(*[F.col(c) for c in _RECORD_COLUMNS], F.col("ingested_at"), *parsed_columns)


#: Bronze's columns (:func:`to_bronze`).
BRONZE_COLUMNS = (*_RECORD_COLUMNS, "ingest_date", "ingested_at")
#: Whether a row of :func:`parse_records` is on a telemetry topic.
IS_TELEMETRY = "is_telemetry"
#: The columns of flagged :func:`parse_records` rows besides the payload fields (which must not clash).
PARSED_RECORD_COLUMNS = (*BRONZE_COLUMNS, IS_TELEMETRY, "topic_tags", "parse_error", "failed_expectations")


def parse_records(bronze: DataFrame, payload: PayloadConfig) -> DataFrame:
    """Every bronze row, with ``is_telemetry`` and, on telemetry rows, :func:`parse_telemetry`'s columns.

    One frame for both bronze and everything derived from the parsed rows, so a batch whose rows all go to
    the driver reads its source once (other rows have null parsed columns and are only bronze).
    """
    telemetry = topic_matches(payload.template)
    parsed = bronze.withColumn("_json", F.when(telemetry, _payload_json(payload)))
    return parsed.select(
        *bronze.columns,
        telemetry.alias(IS_TELEMETRY),
        *[F.when(telemetry, column).alias(name) for name, column in _parsed_columns(payload)],
    )


def _payload_json(payload: PayloadConfig) -> Column:
    field_ddl = ", ".join(f"`{name}` {type_name}" for name, type_name in payload.fields.items())
    schema = f"{field_ddl}, `{_CORRUPT}` string"
    return F.from_json(F.col("payload").cast("string"), schema, {"columnNameOfCorruptRecord": _CORRUPT})


def _parsed_columns(payload: PayloadConfig) -> list[tuple[str, Column]]:
    """What parsing adds to a record (given its ``_json``), by name."""
    template = payload.template
    columns = [
        ("device_id", _placeholder(template, "device_id")),
        ("topic_tags", _topic_tags(template)),
        ("event_time", _event_time(payload)),
        *[(name, F.col("_json").getField(name)) for name in payload.fields],
        ("parse_error", F.col("_json").isNull() | F.col("_json").getField(_CORRUPT).isNotNull()),
    ]
    return columns


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


def to_quarantine(flagged: DataFrame, run_id: str, batch_id: int, quarantined_at: datetime) -> DataFrame:
    """Rows that failed parsing or an expectation, raw payload kept, with the reason."""
    stamp = F.lit(quarantined_at).cast("timestamp")
    rejected = flagged.where(is_quarantined())
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
        F.lit(run_id).alias("run_id"),
        F.lit(batch_id).cast("bigint").alias("batch_id"),
        F.to_date(stamp).alias("quarantine_date"),
        stamp.alias("quarantined_at"),
    )


#: Record columns only quarantine keeps (the raw message): no other step reads them.
RAW_COLUMNS = ("client_id", "qos", "retain", "properties", "payload")


def without_raw_columns(parsed: DataFrame) -> DataFrame:
    """Parsed rows without :data:`RAW_COLUMNS`: what a batch caches for every step but quarantine."""
    return parsed.drop(*RAW_COLUMNS)


def with_raw_columns(rows: DataFrame, bronze: DataFrame) -> DataFrame:
    """``rows`` (parsed, without :data:`RAW_COLUMNS`) with those columns again, from the batch's bronze rows.

    A record read twice in a batch is one record (same key, same message): each row of ``rows`` gets its
    columns once. Only the bronze rows of ``rows``' records are kept before that (``rows`` is few).
    """
    raw = bronze.select(*_RECORD_KEY, *RAW_COLUMNS).join(rows.select(*_RECORD_KEY), _RECORD_KEY, "left_semi")
    return rows.join(raw.dropDuplicates(_RECORD_KEY), _RECORD_KEY)


def passed_rows(flagged: DataFrame) -> DataFrame:
    """Rows that parsed and met every expectation: the candidates for silver."""
    return flagged.where(~is_quarantined())


def _message_id(id_fields: Sequence[str]) -> list[Column]:
    """A row's device message id: its device id and the configured payload fields, as columns."""
    return [F.col("device_id"), *[F.col(name) for name in id_fields]]


def _all_set(columns: Sequence[Column]) -> Column:
    complete = F.lit(True)
    for column in columns:
        complete = complete & column.isNotNull()
    return complete


def drop_duplicates_in_batch(rows: DataFrame, id_fields: Sequence[str], window_seconds: int) -> DataFrame:
    """Keep one row per (broker, topic, offset), and per device message id within ``window_seconds``.

    A row is a duplicate when a row with the same message id and an event time at most ``window_seconds``
    earlier precedes it (ties: earlier broker time, then broker, topic, offset), so what survives does not
    depend on how Spark partitioned the batch. Rows without a complete message id are never merged with
    other messages. One window does both: a record read twice carries the same payload, hence the same
    message id and event time, and a row without a message id is keyed by its record instead. The key is
    the columns themselves (no string is built per row): a row with a complete id has its id and nulls
    for the record, one without has nulls for the id and its record, which is never null.
    """
    order = [F.col("event_time"), F.col("timestamp"), F.col("broker"), F.col("topic"), F.col("offset")]
    record = [F.col("broker"), F.col("topic"), F.col("offset")]
    key = record
    if id_fields:
        message_id = _message_id(id_fields)
        complete = _all_set(message_id)
        key = [F.when(complete, c) for c in message_id] + [F.when(~complete, c) for c in record]
    previous = F.lag("event_time").over(Window.partitionBy(*key).orderBy(*order))
    keyed = rows.withColumn("_previous", previous)
    elapsed = F.col("event_time").cast("double") - F.col("_previous").cast("double")
    duplicate = F.col("_previous").isNotNull() & (elapsed <= window_seconds)
    return keyed.where(~duplicate).drop("_previous")


def drop_already_stored(
    rows: DataFrame, stored: DataFrame, id_fields: Sequence[str], window_seconds: int
) -> DataFrame:
    """Drop rows whose device message id is already in ``stored`` (silver) within ``window_seconds``.

    ``stored`` needs ``device_id``, ``event_time`` and the id fields; the caller narrows it to the event
    time range of the batch widened by the window, so this stays a small join. A row with a part of its id
    missing matches nothing (null is equal to nothing).
    """
    if not id_fields:
        return rows
    names = ["device_id", *id_fields]
    left = rows.alias("new")
    right = stored.select(*names, "event_time").where(_all_set(_message_id(id_fields))).alias("old")
    elapsed = F.abs(F.col("new.event_time").cast("double") - F.col("old.event_time").cast("double"))
    condition = elapsed <= window_seconds
    for name in names:
        condition = (F.col(f"new.{name}") == F.col(f"old.{name}")) & condition
    return left.join(right, condition, "left_anti")


def without_records_of(stored: DataFrame, batch: DataFrame) -> DataFrame:
    """``stored`` rows that are not one of ``batch``'s records (by broker, topic, offset).

    What silver held before this batch, whether or not an earlier attempt of the batch already appended
    to it: a row cannot be a duplicate of itself, and a minute must not count it twice.
    """
    return stored.join(F.broadcast(batch.select(*_RECORD_KEY)), _RECORD_KEY, "left_anti")


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


def profile_aggregates() -> list[Column]:
    """Aggregates over flagged rows that tell the job which writes a batch needs and what to read.

    ``passed`` / ``quarantined`` counts (a write with no rows is skipped), and the event time range of
    the passed rows (bounding the silver lookups for duplicates and for the minutes to recompute).
    """
    passed = ~is_quarantined()
    return [
        F.count(F.when(passed, 1)).alias("passed"),
        F.count(F.when(~passed, 1)).alias("quarantined"),
        F.unix_micros(F.min(F.when(passed, F.col("event_time")))).alias("low_us"),
        F.unix_micros(F.max(F.when(passed, F.col("event_time")))).alias("high_us"),
    ]


def event_time_between(low_us: int, high_us: int) -> Column:
    """Rows of a table partitioned by ``event_date`` whose event time is in [low, high] (epoch micros).

    Bounds travel as epoch microseconds because a timestamp collected to Python comes back in the driver's
    local time zone, while ``event_date`` is the UTC date.
    """
    low, high = F.timestamp_micros(F.lit(low_us)), F.timestamp_micros(F.lit(high_us))
    return F.col("event_date").between(F.to_date(low), F.to_date(high)) & F.col("event_time").between(
        low, high
    )


def event_time_bounds(rows: DataFrame) -> tuple[datetime | None, datetime | None]:
    """Earliest and latest event time of ``rows`` (one small Spark job), or (None, None) when empty."""
    bounds = rows.agg(F.min("event_time").alias("low"), F.max("event_time").alias("high")).first()
    return (bounds["low"], bounds["high"]) if bounds else (None, None)


def touched_minutes(rows: DataFrame) -> DataFrame:
    """The (device_id, minute) pairs a batch of silver rows falls into: the gold rows to recompute."""
    return rows.select("device_id", F.date_trunc("minute", "event_time").alias("minute")).distinct()


def minute_aggregates(
    silver: DataFrame, metrics: Sequence[str], updated_at: datetime, touched: str | None = None
) -> DataFrame:
    """Per device and minute of event time: message count and min/max/avg of each metric.

    Given *all* silver rows of the minutes concerned, the result is the complete value of those gold rows,
    so merging it is idempotent and late data simply recomputes its minute. With ``touched`` (a boolean
    column of ``silver``), only minutes having a row where it is true are kept.
    """
    stats = []
    for metric in metrics:
        value = F.col(metric).cast("double")
        stats += [F.min(value).alias(f"{metric}_min"), F.max(value).alias(f"{metric}_max")]
        stats.append(F.avg(value).alias(f"{metric}_avg"))
    if touched is not None:
        stats.append(F.max(touched).alias(touched))
    grouped = silver.groupBy("device_id", F.date_trunc("minute", "event_time").alias("minute"))
    rows = grouped.agg(F.count(F.lit(1)).alias("count"), *stats)
    if touched is not None:
        rows = rows.where(F.col(touched))
    return rows.select(
        "device_id",
        "minute",
        F.to_date("minute").alias("event_date"),
        "count",
        *[f"{metric}_{stat}" for metric in metrics for stat in ("min", "max", "avg")],
        F.lit(updated_at).cast("timestamp").alias("updated_at"),
    )


def touched_minute_aggregates(
    stored: DataFrame, silver_rows: DataFrame, metrics: Sequence[str], updated_at: datetime
) -> DataFrame:
    """:func:`minute_aggregates` of ``stored`` plus ``silver_rows``, for the minutes ``silver_rows`` touch.

    ``stored`` is silver before the batch, narrowed to whole minutes of the batch's event-time range. One
    aggregation does it: each row carries whether it is new, and a minute without new rows is left out.
    """
    columns = ["device_id", "event_time", *metrics]
    tagged = stored.select(*columns, F.lit(False).alias("_new")).unionByName(
        silver_rows.select(*columns, F.lit(True).alias("_new"))
    )
    return minute_aggregates(tagged, metrics, updated_at, touched="_new")


def parse_status(bronze: DataFrame, devices: DevicesConfig) -> DataFrame:
    """Status-topic rows reduced to what ``devices`` needs: device, broker time, broker, firmware."""
    template = devices.status_template
    if template is None:
        raise ValueError("parse_status needs gold.devices.status_topic_template")
    firmware = F.get_json_object(F.col("payload").cast("string"), f"$.{devices.status_firmware_field}")
    return bronze.where(topic_matches(template)).select(
        _placeholder(template, "device_id").alias("device_id"),
        "timestamp",
        "broker",
        firmware.alias("firmware_version"),
        F.lit(None).cast("string").alias("group"),
        _topic_tags(template).alias("tags"),
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
KEPT_DEVICE_ATTRIBUTES = ("firmware_version", "tags", "group")


def device_update_set(columns: Sequence[str]) -> dict[str, str]:
    """The ``devices`` merge's update: every column from the batch, the attributes it lacks kept.

    Plain SQL both backends read alike (``coalesce``), so the stored table need not be joined first.
    """
    return {c: f"coalesce(s.`{c}`, t.`{c}`)" if c in KEPT_DEVICE_ATTRIBUTES else f"s.`{c}`" for c in columns}
