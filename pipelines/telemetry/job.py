"""The telemetry streaming query: every record parsed, flagged and deduplicated on the executors, then one
``foreachBatch`` writing bronze, silver, quarantine, device_minute, devices and dq_results.

What runs where. The streaming part of the query (:func:`telemetry_rows`) runs in the Spark tasks: the
source's read, the ingest stamp, the payload parsed into the configured fields, every expectation as a
Spark expression, and the duplicate flag kept in Spark's state store (:mod:`.dedup`). ``foreachBatch``
(:class:`TelemetryBatch`) caches the flagged batch on the executors and runs one aggregation over it (how
many rows passed, failed and repeat a message, and every expectation's failures); then every table is
written from the cache concurrently (a small batch's from one partition: one task per write): the appends
by the tasks, the driver committing their files (:mod:`sinks.delta_rs`); ``device_minute`` and
``devices`` as merges of one row per device and minute, or per device, that the tasks aggregate;
``dq_results`` from the counts and Great Expectations on a sample of at most ``quality.gx.max_rows`` rows.
The driver plans, commits and merges what does not grow with a batch's rows.

Why one query and not bronze → (change feed) → silver: a second query only starts once the first has
committed, so silver would lag bronze by a trigger interval plus a commit. Exactly-once holds per table:
every write is keyed by (query id, batch id) in that table's Delta log (:mod:`sinks.foreach_batch`), and the
duplicate flags are the state store's for the batch, so a batch that fails half-way is replayed by Spark
with the same offsets and the same flags and writes only the tables it had not written.
See docs/telemetry-pipeline.md.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from pipelines import available_now as available_now_run
from pipelines.maintenance.config import MIN_BATCHES_TO_RETAIN_CONF, MaintenanceTarget
from pipelines.maintenance.scheduler import MaintenanceScheduler
from pipelines.metrics import PipelineMetrics
from pipelines.output_paths import check_backend, check_checkpoint, check_output_location, check_table_root
from pipelines.payloads.sparkplug_tables import sparkplug_metrics
from pipelines.preflight import require_brokers
from pipelines.supervisor import Supervisor
from sinks import BatchWriter, TableCatalog, TableStore, build_catalog, exactly_once, open_table_store
from sinks.tables import device_minute
from sources.options import parse_options

from . import quality as Q
from . import sparkplug
from . import transforms as T
from .config import STANDARD_COLUMNS, TelemetryConfig, load_telemetry_config
from .dedup import DUPLICATE, flag_duplicates

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from pipelines.run_options import RunOptions

log = logging.getLogger(__name__)

#: Restarts in a row after which an ``--available-now`` run gives up on its query (exit status 1): a batch
#: that fails on every replay would otherwise keep a run that must end going for ever.
AVAILABLE_NOW_RESTARTS = 3

#: Spark SQL settings for every batch, set on the session of the batch's DataFrame (a streaming query's own
#: session). Adaptive execution runs each shuffle stage of an action as a Spark job of its own and plans
#: again between them; a micro-batch has nothing for it to adapt to (no skew, a few shuffle partitions), so
#: that is only fixed cost. The batch's cached rows live for one batch and are read a few times:
#: compressing them costs more than it spares.
BATCH_SQL_CONF = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
}

#: The state store of the query's duplicate flags: RocksDB (off the JVM heap, any size), its changes
#: checkpointed each batch. Set before the query starts; a checkpoint keeps the provider it began with.
STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # no batch without new data just to time out idle devices' state: the next batch with data does it
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}

#: A batch with fewer telemetry rows than this is written and aggregated from one partition (its cached
#: partitions read by one task): below it a task's fixed cost (its launch, a Python worker's round trip, the
#: shuffle of an aggregate) outweighs its share of the work, and every Spark job of the batch would run
#: a task per partition, and a shuffle stage for each aggregate, to move a few hundred rows.
ONE_TASK_ROWS = 10_000

#: The tables this pipeline writes.
TABLES = (
    "bronze_telemetry",
    "silver_telemetry",
    "telemetry_quarantine",
    "device_minute",
    "devices",
    "dq_results",
)

#: ``device_minute``'s merge keys: ``event_date`` (a function of ``minute``) lets it read only the
#: partitions a batch touched.
MINUTE_KEYS = ("event_date", "device_id", "minute")


def telemetry_catalog(config: TelemetryConfig) -> TableCatalog:
    """The table catalog with this configuration's silver payload columns and minute metrics."""
    catalog = build_catalog(config.payload.silver_fields)
    return catalog.replace(device_minute(config.gold.minute_metrics)).replace(sparkplug_metrics())


def utc_now() -> datetime:
    return datetime.now(UTC)


def telemetry_rows(
    records: DataFrame, config: TelemetryConfig, conditions: Mapping[str, Column]
) -> DataFrame:
    """The streaming part of the query: source records stamped with the batch's time, parsed, flagged with
    the expectations they fail (``conditions``, :func:`.quality.row_failure_conditions`) and with whether
    they repeat a message (:data:`.dedup.DUPLICATE`). Every record stays: bronze keeps them all.

    Each telemetry template's payloads are read in its format (``payload.formats``, :mod:`.formats`).
    """
    bronze = T.to_bronze(records, F.current_timestamp())
    flagged = T.flag_failures(T.parse_records(bronze, config.payload), conditions)
    candidate = F.col(T.IS_TELEMETRY) & ~T.is_quarantined()
    return flag_duplicates(flagged, config.dedup, candidate)


@dataclass
class BatchReport:
    """What one micro-batch did (logged, and kept for tests and the demo)."""

    batch_id: int
    passed: int = 0
    quarantined: int = 0
    duplicates: int = 0
    written: dict[str, bool] = field(default_factory=dict)
    gx_validated: bool = False
    step_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class _Batch:
    """One micro-batch in flight: its writer, its timestamp, its report."""

    out: BatchWriter
    now: datetime
    report: BatchReport
    after_step: Callable[[str, int], None]

    def step(self, name: str, work: Callable[[], Any]) -> Any:
        """Run one step, time it, then call the ``after_step`` hook."""
        started = time.perf_counter()
        result = work()
        self.report.step_ms[name] = _ms_since(started)
        self.after_step(name, self.out.batch_id)
        return result


class TelemetryBatch:
    """Writes one micro-batch of flagged records (:func:`telemetry_rows`) into every table; holds what
    lives across batches.

    The batch is cached on the executors, one aggregation over it counts what the writes need, then the
    tables are written concurrently (each Spark job is mostly fixed overhead at micro-batch scale, and
    delta-rs frees the GIL while it commits); a batch of fewer than ``one_task_rows`` telemetry rows is
    written from one partition of the cache (:data:`ONE_TASK_ROWS`). The call returns when every table is
    in. ``clock`` stamps ``updated_at``, ``quarantined_at`` and ``observed_at``; tests pass a fixed one.
    """

    def __init__(
        self,
        config: TelemetryConfig,
        store: TableStore,
        clock: Callable[[], datetime] = utc_now,
        gx_validator: Q.GxValidator | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.column_types = {name: t.strip().lower() for name, t in config.payload.fields.items()}
        self.conditions = Q.row_failure_conditions(config.quality.suites, self.column_types)
        self.validator = gx_validator or Q.GxValidator(config.quality.suites, config.quality.gx.engine)
        self.schedule = Q.GxSchedule(config.quality.gx)
        self.reports: deque[BatchReport] = deque(maxlen=1000)  # the latest batches, for logs and tests
        #: where quarantined rows are counted (``supervise`` gives the job's)
        self.metrics = PipelineMetrics()
        #: Called after each step with the step's name and the batch id; tests inject failures here.
        self.after_step: Callable[[str, int], None] = lambda step, batch_id: None
        self._pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix="telemetry-batch")
        #: below this many telemetry rows a batch's writes read one partition (:data:`ONE_TASK_ROWS`)
        self.one_task_rows = ONE_TASK_ROWS
        #: compaction, vacuum and log clean-up of the job's tables, in the background (its own, unless
        #: :meth:`share_maintenance` gave it one that outlives it)
        self.maintenance = MaintenanceScheduler(store, TABLES, config.tables.maintenance)
        self._owns_maintenance = True
        #: the session's own values of what the batch settings replace (read at the first batch, set back
        #: by ``close``)
        self._session_conf: dict[str, str | None] | None = None
        self._configured: SparkSession | None = None  # the session of the latest batch

    def share_maintenance(self, maintenance: MaintenanceScheduler) -> None:
        """Poke ``maintenance`` instead of a scheduler of its own, and leave it open when closed: a
        supervised job's restarts keep one schedule (else a query failing more often than the vacuum
        interval would never be vacuumed)."""
        self.maintenance, self._owns_maintenance = maintenance, False

    def ensure_tables(self) -> None:
        for name in TABLES:
            self.store.ensure(name)

    def close(self) -> None:
        """Release the threads (the query must be stopped) and give the session its own settings back."""
        if self._owns_maintenance:
            self.maintenance.close()
        self._pool.shutdown(wait=True)
        if self._configured is not None and self._session_conf is not None:
            _set_conf(self._configured, self._session_conf)

    def __call__(self, rows: DataFrame, out: BatchWriter) -> None:
        batch = _Batch(out, self.clock(), BatchReport(out.batch_id), self.after_step)
        self._configure_session(rows.sparkSession)
        cached = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # the batch's first Spark job: it reads the source, fills the cache and commits the state store
            counts = batch.step("profile", lambda: self._profile(cached))
            report = batch.report
            report.passed, report.quarantined = counts["passed"], counts["quarantined"]
            report.duplicates = counts["duplicates"]
            small = counts["passed"] + counts["quarantined"] < self.one_task_rows
            self._run_steps(batch, self._steps(batch, cached.coalesce(1) if small else cached, counts))
        finally:
            cached.unpersist()
        batch.report.written = out.results
        self.reports.append(batch.report)
        self.maintenance.poke()
        log.info("telemetry batch %d: %s", out.batch_id, batch.report)

    def _profile(self, rows: DataFrame) -> dict[str, Any]:
        """One aggregation over the batch's telemetry rows: what :meth:`_steps` needs to know."""
        quality = Q.expression_aggregates(self.config.quality.suites, self.column_types)
        telemetry = rows.where(F.col(T.IS_TELEMETRY))
        return _one_row(telemetry.agg(*T.profile_aggregates(DUPLICATE), *quality)).asDict()

    def _steps(
        self, batch: _Batch, rows: DataFrame, counts: Mapping[str, Any]
    ) -> dict[str, Callable[[], Any]]:
        """Each table's write of the batch (a table without rows to write is left alone)."""
        out, now = batch.out, batch.now
        config = self.config
        passed = T.passed_rows(rows)
        silver_rows = passed.where(~F.col(DUPLICATE))
        metrics = config.gold.minute_metrics
        steps: dict[str, Callable[[], Any]] = {
            "bronze_telemetry": lambda: out.append("bronze_telemetry", rows.select(*T.BRONZE_COLUMNS)),
        }
        if counts["passed"] > counts["duplicates"]:
            fields = list(config.payload.silver_fields)
            steps["silver_telemetry"] = lambda: out.append(
                "silver_telemetry", T.to_silver(silver_rows, fields)
            )
            steps["device_minute"] = lambda: out.merge(
                "device_minute",
                T.minute_increments(silver_rows, metrics, now),
                keys=MINUTE_KEYS,
                update_set=T.minute_merge_set(metrics),
            )
        if counts["quarantined"]:
            quarantine = T.to_quarantine(rows, config.payload, out.app_id, out.batch_id, now)
            steps["telemetry_quarantine"] = lambda: self._write_quarantine(out, quarantine, counts)
        if counts["passed"] or config.gold.devices.status_template is not None:
            steps["devices"] = lambda: self._write_devices(batch, rows, passed)
        if counts["dq_rows"]:
            outcomes = Q.outcomes_from_counts(counts, config.quality.suites)
            telemetry = rows.where(F.col(T.IS_TELEMETRY))
            max_rows = config.quality.gx.max_rows
            steps["dq_results"] = lambda: self._write_dq(
                batch,
                outcomes,
                lambda: Q.gx_outcomes(self.validator, telemetry, self._gx_columns(), max_rows),
            )
        return steps

    def _run_steps(self, batch: _Batch, steps: Mapping[str, Callable[[], Any]]) -> None:
        """Run the steps concurrently; re-raise a failure.

        Every step ends before this returns or raises: the caller releases the cached rows the steps read,
        and a step still running must not write after its batch failed. The failure raised is the first
        one that happened (a later one may only follow from it); the batch is then replayed.
        """
        failures: list[BaseException] = []

        def run(name: str, work: Callable[[], Any]) -> None:
            try:
                batch.step(name, work)
            except BaseException as exc:
                failures.append(exc)  # list.append is atomic: the order is the order they failed in
                raise

        futures = [self._pool.submit(run, name, work) for name, work in steps.items()]
        wait(futures)
        if failures:
            raise failures[0]

    def _configure_session(self, spark: SparkSession) -> None:
        """Set :data:`BATCH_SQL_CONF` (over the session's own values, which ``close`` sets back).

        Set at every batch: a streaming query hands each batch a new handle on its own session.
        """
        if self._session_conf is None:
            self._session_conf = {key: spark.conf.get(key, None) for key in BATCH_SQL_CONF}
        _set_conf(spark, BATCH_SQL_CONF)
        self._configured = spark

    def _already_written(self, name: str, out: BatchWriter) -> bool:
        committed = self.store.committed_batch(name, out.app_id) if self.store.exists(name) else None
        return committed is not None and committed >= out.batch_id

    def _write_quarantine(self, out: BatchWriter, rows: DataFrame, counts: Mapping[str, Any]) -> None:
        """Append the quarantined rows; once written, count them by reason."""
        if out.append("telemetry_quarantine", rows):
            unparseable = counts[T.REASON_UNPARSEABLE]
            self.metrics.quarantined.labels("telemetry", T.REASON_UNPARSEABLE).inc(unparseable)
            expectations = counts["quarantined"] - unparseable
            self.metrics.quarantined.labels("telemetry", T.REASON_EXPECTATIONS).inc(expectations)

    # -- devices -----------------------------------------------------------------------------------------

    def _write_devices(self, batch: _Batch, rows: DataFrame, passed: DataFrame) -> None:
        """Upsert the devices seen, from the telemetry rows that passed (a resent reading too: the device
        was seen) and the status rows; ``last_seen`` only moves forward, known attributes are kept.

        An attribute the batch does not carry (null) keeps its stored value inside the merge itself, so
        the stored table is not read into Spark first.
        """
        devices = self.config.gold.devices
        sightings = T.telemetry_sightings(passed, devices)
        if devices.status_template is not None:
            sightings = sightings.unionByName(T.parse_status(rows, devices))
        updates = T.device_updates(sightings, batch.now)
        batch.out.merge(
            "devices",
            updates,
            update_when="s.last_seen >= t.last_seen",
            update_set=T.device_update_set(updates.columns),
        )

    # -- data quality ------------------------------------------------------------------------------------

    def _write_dq(
        self,
        batch: _Batch,
        outcomes: list[Q.ExpectationOutcome],
        validate: Callable[[], tuple[list[Q.ExpectationOutcome], int]],
    ) -> None:
        """One dq_results row per expectation: from GX when it validates this batch (``validate``: its
        outcomes and the rows it saw), else the expressions'.

        GX is skipped on a replay whose results are already in the table.
        """
        out = batch.out
        gx: list[Q.ExpectationOutcome] | None = None
        validated = 0
        suites = self.config.quality.suites
        due = any(suite.expectations for suite in suites) and self.schedule.due(out.batch_id)
        if due and not self._already_written("dq_results", out):
            try:
                gx, validated = validate()
                self.schedule.ran()
            except Exception:  # a broken validation must not stop ingestion; the expressions still count
                log.exception("Great Expectations validation of batch %d failed", out.batch_id)
        merged = Q.merge_outcomes(outcomes, gx, validated)
        rows = Q.outcome_rows(merged, out.app_id, out.batch_id, batch.now)
        out.append(
            "dq_results", pa.Table.from_pylist(rows, schema=self.store.spec("dq_results").arrow_schema)
        )
        batch.report.gx_validated = gx is not None

    def _gx_columns(self) -> list[str]:
        """The columns GX validates: the standard ones, then the payload's."""
        fields = self.config.payload.fields
        return [*STANDARD_COLUMNS, *[f for f in fields if f not in STANDARD_COLUMNS]]


# -- the streaming query ---------------------------------------------------------------------------------


def open_store(spark: SparkSession | None, config: TelemetryConfig) -> TableStore:
    tables = config.tables
    return open_table_store(
        spark,
        tables.root,
        tables.backend,
        telemetry_catalog(config),
        namespace=tables.namespace,
        storage_options=dict(tables.storage_options) or None,
    )


def start_query(
    spark: SparkSession,
    config: TelemetryConfig,
    batch: TelemetryBatch,
    available_now: bool = False,
    source_options: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """Start the streaming query (source → :func:`telemetry_rows` → foreachBatch); the caller waits for or
    stops it, then closes ``batch``."""
    from sources import register_sources

    register_sources(spark)
    options = dict(config.source_options())
    options.update(source_options or {})
    if available_now:
        options.update(available_now_run.source_options(spark))
    records = spark.readStream.format("timestone").options(**options).load()
    return start_query_on(records, config, batch, available_now)


def start_query_on(
    records: DataFrame, config: TelemetryConfig, batch: TelemetryBatch, available_now: bool = False
) -> StreamingQuery:
    """:func:`start_query` on a streaming DataFrame of records with the ``timestone`` source's columns."""
    spark = records.sparkSession
    # Spark purges the checkpoint's offsets and commits older than this many batches as the query runs
    spark.conf.set(MIN_BATCHES_TO_RETAIN_CONF, str(config.tables.maintenance.checkpoint_batches))
    _set_conf(spark, STATE_STORE_CONF)
    writer = (
        telemetry_rows(records, config, batch.conditions)
        .writeStream.queryName(config.stream.query_name)
        .option("checkpointLocation", config.stream.checkpoint)
        .foreachBatch(exactly_once(batch.store, batch, persist=False))  # the batch caches its rows itself
    )
    if available_now:
        return available_now_run.start(writer, spark)
    return writer.trigger(processingTime=config.stream.trigger_interval).start()


def maintenance_target(spark: SparkSession | None, config: TelemetryConfig) -> MaintenanceTarget:
    """The tables ``timestone tables maintain telemetry`` maintains, and how (``tables.maintenance``)."""
    return MaintenanceTarget(open_store(spark, config), TABLES, config.tables.maintenance)


def validate(section: Any) -> TelemetryConfig:
    """Check the ``telemetry`` config section (raises ConfigError naming the field) before Spark starts:
    every key, the source's options, the trigger, the places it writes and the checkpoint it resumes from."""
    config = load_telemetry_config(section)
    check_backend(config.tables.backend, "telemetry.tables.backend")
    check_output_location(config.tables.root, "telemetry.tables.root")
    check_table_root(config.tables.root, "telemetry.tables.root")
    check_output_location(config.stream.checkpoint, "telemetry.stream.checkpoint")
    for checkpoint in (config.stream.checkpoint, sparkplug.checkpoint(config)):
        check_checkpoint(checkpoint, "telemetry.stream.checkpoint")
    return config


def preflight(config: TelemetryConfig, options: RunOptions) -> None:
    """With ``--available-now``, the brokers must answer (``pipelines.preflight``): the run reads what they
    hold now and would otherwise end with nothing from them."""
    if options.available_now:
        require_brokers(parse_options(config.source_options()))


def run(spark: SparkSession, section: Any, options: RunOptions) -> int:
    """``timestone pipeline telemetry``: run until stopped, or until caught up with ``--available-now``."""
    config = load_telemetry_config(section)
    return supervise(spark, config, options.available_now, options.metrics)


def supervise(
    spark: SparkSession,
    config: TelemetryConfig,
    available_now: bool = False,
    metrics: PipelineMetrics | None = None,
    make_batch: Callable[[TelemetryConfig, TableStore], TelemetryBatch] = TelemetryBatch,
    supervisor: Supervisor | None = None,
) -> int:
    """Run the query, restarting it from its checkpoint when it fails (:mod:`pipelines.supervisor`), until
    it is stopped (Ctrl-C), has caught up (``available_now``) or fails for good; the exit status.

    Each start gets a new :class:`TelemetryBatch` (``make_batch``), which redoes the gold part the failed
    one may have left undone (:meth:`TelemetryBatch.resume`); the one before is closed once its query ended.
    All of them share one maintenance schedule.
    """
    store = open_store(spark, config)
    supervisor = supervisor or Supervisor("telemetry", config.stream.restart, metrics or PipelineMetrics())
    if available_now and supervisor.give_up_after is None:
        supervisor.give_up_after = AVAILABLE_NOW_RESTARTS
    batches: list[TelemetryBatch] = []
    maintenance = MaintenanceScheduler(store, TABLES, config.tables.maintenance)

    def start() -> StreamingQuery:
        batch = make_batch(config, store)
        batch.share_maintenance(maintenance)
        batch.metrics = supervisor.metrics
        batch.ensure_tables()
        batches.append(batch)
        query = start_query(spark, config, batch, available_now=available_now)
        log.info("telemetry query %s started: tables at %s (%s)", query.id, config.tables.root, store.backend)
        return query

    def ended(query: StreamingQuery) -> None:
        batches.pop().close()

    supervisor.add(config.stream.query_name, start, ended)
    sparkplug.supervise_query(spark, config, store, supervisor, available_now)
    try:
        return supervisor.run()
    except KeyboardInterrupt:
        log.info("stopping the telemetry query")
        return 0
    finally:
        for query in supervisor.running():
            query.stop()
        while batches:
            batches.pop().close()
        maintenance.close()


def _ms_since(began: float) -> float:
    return round(1000 * (time.perf_counter() - began), 1)


def _set_conf(spark: SparkSession, conf: Mapping[str, str | None]) -> None:
    """Set the session's SQL settings to ``conf`` (None: unset)."""
    for key, value in conf.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def _one_row(frame: DataFrame) -> Row:
    """The row of an aggregate without grouping (there is always exactly one)."""
    row = frame.first()
    assert row is not None, "an aggregate without grouping has one row"
    return row
