"""The telemetry streaming query: one ``foreachBatch`` writes bronze, silver, quarantine, gold and dq_results.

Why one query and not bronze → (change feed) → silver: a second query only starts once the first has
committed, so silver would lag bronze by a trigger interval plus a commit; here silver is written in the
same micro-batch, a few hundred milliseconds after bronze. Exactly-once holds per table: every write is
keyed by (query id, batch id) in that table's Delta log (:mod:`sinks.foreach_batch`), so a batch that
fails half-way is replayed by Spark with the same offsets and writes only the tables it had not written.

Order inside a batch: the fast part first, bronze (lowest latency for the raw layer), one profile
aggregation, then silver and quarantine concurrently; then the gold part, device_minute, devices and
dq_results concurrently (the Great Expectations validation runs there). At a processing-time trigger the
gold part runs in the background while the next batch's fast part runs (see :class:`TelemetryBatch` for why
that stays exactly-once). With delta-rs a batch is one Spark job, its records read, parsed and collected as
Arrow, and every step works on that in the driver (:meth:`TelemetryBatch._rows_in_driver`). See
docs/telemetry-pipeline.md.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame, Row, SparkSession

from broker_edge.config.loader import ConfigError
from pipelines import available_now as available_now_run
from pipelines.maintenance.config import MIN_BATCHES_TO_RETAIN_CONF, MaintenanceTarget
from pipelines.maintenance.scheduler import MaintenanceScheduler
from pipelines.metrics import PipelineMetrics
from pipelines.output_paths import check_output_location
from pipelines.preflight import require_brokers
from pipelines.supervisor import Supervisor
from sinks import BatchWriter, TableCatalog, TableStore, build_catalog, exactly_once, open_table_store
from sinks.store import TimeRange
from sinks.tables import device_minute
from sources.options import parse_options

from . import driver_devices, driver_minutes, driver_rows, driver_silver
from . import quality as Q
from . import transforms as T
from .config import STANDARD_COLUMNS, TelemetryConfig, load_telemetry_config

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from pipelines.run_options import RunOptions

log = logging.getLogger(__name__)

#: At most this many telemetry rows in the previous batch: bronze is appended from the driver (Arrow).
SMALL_BATCH_ROWS = 20_000

#: Spark SQL settings for every batch, set on the session of the batch's DataFrame (a streaming query's own
#: session). Adaptive execution runs each shuffle stage of an action as a Spark job of its own and plans
#: again between them; a micro-batch (a few hundred rows live, up to ``maxRecordsPerTrigger`` catching up)
#: has nothing for it to adapt to (no skew, a few shuffle partitions), so that is only fixed cost: a
#: 100,000-row batch used about 15 % more CPU with it.
BATCH_SQL_CONF = {"spark.sql.adaptive.enabled": "false"}

#: Spark SQL settings added for a batch that is not expected small (a catch-up one). Its cached rows live
#: for one batch and are read a few times: compressing them costs more than it spares.
LARGE_BATCH_SQL_CONF = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}

#: The tables of a batch's gold part (see :class:`TelemetryBatch`).
GOLD = ("device_minute", "devices", "dq_results")

#: The tables this pipeline writes, in the order a micro-batch writes them.
TABLES = (
    "bronze_telemetry",
    "silver_telemetry",
    "telemetry_quarantine",
    "device_minute",
    "devices",
    "dq_results",
)


def telemetry_catalog(config: TelemetryConfig) -> TableCatalog:
    """The table catalog with this configuration's silver payload columns and minute metrics."""
    catalog = build_catalog(config.payload.silver_fields)
    return catalog.replace(device_minute(config.gold.minute_metrics))


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class BatchReport:
    """What one micro-batch did (logged, and kept for tests and the demo)."""

    batch_id: int
    passed: int = 0
    quarantined: int = 0
    written: dict[str, bool] = field(default_factory=dict)
    gx_validated: bool = False
    step_ms: dict[str, float] = field(default_factory=dict)
    #: the whole fast part (its steps and what prepares them), and how long the call then waited for the
    #: previous batch's gold part (both None when not measured: a direct call, a redone batch)
    fast_part_ms: float | None = None
    gold_wait_ms: float | None = None


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


@dataclass
class _GoldPart:
    """A batch's gold part: its steps, and the cached DataFrames to release once they ran."""

    owner: TelemetryBatch
    batch: _Batch
    steps: dict[str, Callable[[], Any]]
    cached: list[DataFrame]
    #: whether the batch's report is in ``owner.reports`` already (else it joins once the steps are done)
    reported: bool = False

    def run(self) -> None:
        try:
            self.owner._run_steps(self.batch, self.steps)
        finally:
            self.release()
        self.owner.maintenance.poke()
        if not self.reported:
            self.owner.reports.append(self.batch.report)
        log.info("telemetry batch %d: %s", self.batch.out.batch_id, self.batch.report)

    def release(self) -> None:
        _unpersist(self.cached)


class TelemetryBatch:
    """Processes one micro-batch of source records into every table; holds what lives across batches.

    A batch has a fast part and a gold part. The fast part writes bronze, runs one aggregation over the
    parsed and flagged rows (which decides which writes the batch needs and carries the data-quality
    counts), then writes silver and quarantine (concurrently): after it, the batch's readings are visible.
    The gold part writes device_minute, devices and dq_results (concurrently). With ``defer_gold`` (what
    :func:`start_query` sets by default) the call returns after the fast part and the gold
    part runs in the background, while the next batch's fast part runs; the next call waits for it before
    returning, so when Spark commits a batch, the gold part of the batch before it is in. A driver that
    dies may therefore leave one committed batch without its gold part: a new instance redoes it from that
    batch's bronze rows (:meth:`TableStore.appended`), every write skipped where it is in, before its query
    starts (:meth:`resume`, from the checkpoint) or else at its first call, whatever its trigger. Without
    ``defer_gold``, silver and quarantine run with the gold steps, all at once, and the call returns when
    all are in. ``clock`` stamps ``ingested_at``/``updated_at``; tests pass a fixed one.
    """

    def __init__(
        self,
        config: TelemetryConfig,
        store: TableStore,
        clock: Callable[[], datetime] = utc_now,
        gx_validator: Q.GxValidator | None = None,
        *,
        defer_gold: bool = False,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.defer_gold = defer_gold
        self.column_types = {name: t.strip().lower() for name, t in config.payload.fields.items()}
        self.conditions = Q.row_failure_conditions(config.quality.suites, self.column_types)
        self.validator = gx_validator or Q.GxValidator(config.quality.suites, config.quality.gx.engine)
        self.schedule = Q.GxSchedule(config.quality.gx)
        self.reports: deque[BatchReport] = deque(maxlen=1000)  # the latest batches, for logs and tests
        #: Called after each step with the step's name and the batch id; tests inject failures here.
        self.after_step: Callable[[str, int], None] = lambda step, batch_id: None
        self._pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix="telemetry-batch")
        self._gold = ThreadPoolExecutor(max_workers=1, thread_name_prefix="telemetry-gold")
        self._pending: Future[None] | None = None
        #: compaction, vacuum and log clean-up of the job's tables, in the background (its own, unless
        #: :meth:`share_maintenance` gave it one that outlives it)
        self.maintenance = MaintenanceScheduler(store, TABLES, config.tables.maintenance)
        self._owns_maintenance = True
        self._resumed = False
        #: telemetry rows of the latest batch (None before the first): small batches append bronze via Arrow
        self._last_rows: int | None = None
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

    def settle(self) -> None:
        """Wait for the gold part of the latest batch, if it is running; re-raise its failure."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Finish the gold part in flight and release the threads (the query must be stopped)."""
        try:
            self.settle()
        except Exception:  # the next start redoes it (see the class docstring)
            log.exception("the gold part of the last telemetry batch failed")
        finally:
            self._gold.shutdown(wait=True)
            if self._owns_maintenance:
                self.maintenance.close()
            self._pool.shutdown(wait=True)
            if self._configured is not None and self._session_conf is not None:
                _set_conf(self._configured, self._session_conf)

    def __call__(self, records: DataFrame, out: BatchWriter) -> None:
        if not self._resumed:  # whatever the trigger: the last instance may have deferred its gold part
            self._complete_previous(out.app_id, out.batch_id - 1)
        self._resumed = True
        began = time.perf_counter()
        gold = self._fast_part(records, out)
        report = gold.batch.report
        report.fast_part_ms = _ms_since(began)
        if not self.defer_gold:
            gold.run()
            return
        began = time.perf_counter()
        try:
            self.settle()  # the previous batch's gold part ran alongside this batch's fast part
        except BaseException:
            gold.release()
            raise
        report.gold_wait_ms = _ms_since(began)
        self._pending = self._gold.submit(gold.run)

    def resume(self, checkpoint: str) -> None:
        """Before the query starts: redo the checkpoint's last committed batch where its gold part is missing.

        Spark runs no batch when there is nothing new to read (an availableNow restart of a caught-up
        query), so the first call cannot be relied on for it. A checkpoint this cannot read (not on the
        local file system) leaves it to the first call.
        """
        committed = last_committed_batch(checkpoint)
        if committed is not None and not self._resumed:
            app_id, batch_id = committed
            self._complete_previous(app_id, batch_id)
            self._resumed = True  # the first call's batch follows that one (or replays the one after it)

    def _complete_previous(self, app_id: str, previous: int) -> None:
        """Redo batch ``previous`` from its bronze rows: its gold part may not have run.

        Its tables hold it or not; where they do, the write is skipped (its ``txn``), so this only fills in
        what a driver that died while the gold part ran had not written.
        """
        if previous < 0 or not self.store.exists("bronze_telemetry"):
            return
        if all(self._already_written(name, BatchWriter(self.store, app_id, previous)) for name in GOLD):
            return  # the usual case: a batch that passed rows writes every one of them
        rows = self.store.appended("bronze_telemetry", app_id, previous)
        if rows is None:
            return
        log.info("telemetry batch %d: gold part redone from its bronze rows", previous)
        self._fast_part(rows, BatchWriter(self.store, app_id, previous)).run()

    def _fast_part(self, records: DataFrame, out: BatchWriter) -> _GoldPart:
        """Bronze, the profile, and with ``defer_gold`` silver and quarantine; returns what is left to run.

        Without ``defer_gold`` silver and quarantine join the gold steps, all running concurrently, and
        the tables are complete when the call returns (a direct call, a batch redone).
        """
        batch = _Batch(out, self.clock(), BatchReport(out.batch_id), self.after_step)
        self._configure_session(records.sparkSession)
        if self._rows_in_driver():
            return self._driver_fast_part(records, batch)
        return self._spark_fast_part(records, batch)

    def _driver_fast_part(self, records: DataFrame, batch: _Batch) -> _GoldPart:
        """:meth:`_fast_part` with one Spark job: the source read, parsed and flagged, collected as Arrow;
        every table's rows are then computed from it in the driver (:mod:`.driver_rows`,
        :mod:`.driver_silver`, :mod:`.driver_minutes`, :mod:`.driver_devices`)."""
        out = batch.out
        bronze = T.to_bronze(records, batch.now)
        frame = T.flag_failures(T.parse_records(bronze, self.config.payload), self.conditions)
        collected = batch.step("collect", frame.toArrow)
        bronze_rows = driver_rows.bronze_rows(collected, bronze.columns)
        appending = self._pool.submit(  # while the rest is computed (delta-rs frees the GIL)
            batch.step, "bronze_telemetry", lambda: out.append("bronze_telemetry", bronze_rows)
        )
        try:
            telemetry = driver_rows.telemetry_rows(collected)
            suites = self.config.quality.suites
            counts = batch.step("profile", lambda: driver_rows.profile(telemetry, suites, self.column_types))
            fast, gold = self._driver_steps(batch, telemetry, frame, counts)
            appending.result()  # bronze is in before anything else is written
            return self._finish_fast_part(batch, counts, fast, gold, [])
        except BaseException:
            wait([appending])  # no step may outlive its failed batch
            raise

    def _driver_steps(
        self, batch: _Batch, telemetry: pa.Table, frame: DataFrame, counts: Mapping[str, Any]
    ) -> tuple[dict[str, Callable[[], Any]], dict[str, Callable[[], Any]]]:
        """The writes of :meth:`_driver_fast_part`'s batch: silver and quarantine, then the gold part."""
        out = batch.out
        fast: dict[str, Callable[[], Any]] = {}
        gold: dict[str, Callable[[], Any]] = {}
        passed = driver_rows.passed_rows(telemetry)
        if counts["passed"]:
            low, high = counts["low_us"], counts["high_us"]
            replayed = self._already_written("silver_telemetry", out)
            stored = self.store.read_arrow("silver_telemetry", self._stored_range(low, high))
            if replayed:  # a row is not its own duplicate, and a minute must not count it twice
                stored = driver_minutes.without_records_of(stored, passed)
            dedup, fields = self.config.dedup, list(self.config.payload.silver_fields)
            silver = batch.step(
                "dedup",
                lambda: driver_silver.silver_rows(
                    passed, stored, dedup.message_id_fields, dedup.window_seconds, fields
                ),
            )
            minutes = _whole_minutes(low, high).arrow_rows(stored)
            devices = self.config.gold.devices
            fast["silver_telemetry"] = lambda: self._write_silver(out, lambda: silver, replayed)
            gold["device_minute"] = lambda: self._merge_device_minute(batch, minutes, silver)
            gold["devices"] = lambda: self._merge_devices(
                batch, driver_devices.device_updates(passed, devices, batch.now)
            )
        if counts["quarantined"]:
            fast["telemetry_quarantine"] = lambda: out.append(
                "telemetry_quarantine",
                driver_rows.quarantine_rows(telemetry, out.app_id, out.batch_id, batch.now),
            )
        if counts["dq_rows"]:
            outcomes = Q.outcomes_from_counts(counts, self.config.quality.suites)
            schema = frame.select(*self._gx_columns()).schema
            timezone = frame.sparkSession.conf.get("spark.sql.session.timeZone", None)
            max_rows = self.config.quality.gx.max_rows

            def validate() -> tuple[list[Q.ExpectationOutcome], int]:
                parsed = driver_rows.parsed_rows(telemetry)
                return Q.gx_outcomes_of_arrow(self.validator, parsed, schema, timezone, max_rows)

            gold["dq_results"] = lambda: self._write_dq(batch, outcomes, validate)
        return fast, gold

    def _spark_fast_part(self, records: DataFrame, batch: _Batch) -> _GoldPart:
        """:meth:`_fast_part` with the batch's rows cached in Spark and each table's rows a Spark query."""
        out = batch.out
        bronze = T.to_bronze(records, batch.now).persist()  # the gold part reads it after the call returns
        cached = [bronze]
        appending: Future[Any] | None = None
        try:
            if self._collects_bronze():  # appended while the profile runs (delta-rs frees the GIL)
                collected_bronze = bronze.toArrow()
                appending = self._pool.submit(
                    batch.step, "bronze_telemetry", lambda: out.append("bronze_telemetry", collected_bronze)
                )
            else:
                batch.step("bronze_telemetry", lambda: out.append("bronze_telemetry", bronze))
            parsed = T.parse_telemetry(bronze, self.config.payload)
            # cached without the raw columns only quarantine reads (taken from bronze for its rows)
            flagged = T.flag_failures(T.without_raw_columns(parsed), self.conditions)
            cached.append(flagged.persist())
            quality = Q.expression_aggregates(self.config.quality.suites, self.column_types)
            counts = batch.step(
                "profile", lambda: _one_row(flagged.agg(*T.profile_aggregates(), *quality)).asDict()
            )
            if appending is not None:  # bronze is in before anything else is written
                appending.result()
            passed = T.passed_rows(flagged)
            fast: dict[str, Callable[[], Any]] = {}
            gold: dict[str, Callable[[], Any]] = {}
            if counts["passed"]:
                low, high = counts["low_us"], counts["high_us"]
                replayed = self._already_written("silver_telemetry", out)
                before = self._silver_before(passed, self._stored_range(low, high), replayed)
                rows = self._silver_rows(passed, before, low, high)
                if self._minutes_in_driver():  # read once, by whichever of silver and device_minute is first
                    collected = _Collected(rows)
                    stored = self.store.read_arrow("silver_telemetry", _whole_minutes(low, high))
                    fast["silver_telemetry"] = lambda: self._write_silver(out, collected, replayed)
                    gold["device_minute"] = lambda: self._write_device_minute_in_driver(
                        batch, collected, stored, replayed
                    )
                else:
                    rows = rows.persist()
                    cached.append(rows)
                    fast["silver_telemetry"] = lambda: self._write_silver(out, lambda: rows, replayed)
                    gold["device_minute"] = lambda: self._write_device_minute(batch, rows, before, low, high)
            if counts["quarantined"]:
                rejected = T.with_raw_columns(flagged.where(T.is_quarantined()), bronze)
                quarantine = T.to_quarantine(rejected, out.app_id, out.batch_id, batch.now)
                fast["telemetry_quarantine"] = lambda: out.append("telemetry_quarantine", quarantine)
            if counts["passed"] or self.config.gold.devices.status_template is not None:
                gold["devices"] = lambda: self._write_devices(batch, bronze, passed)
            if counts["dq_rows"]:
                outcomes = Q.outcomes_from_counts(counts, self.config.quality.suites)
                max_rows = self.config.quality.gx.max_rows
                gold["dq_results"] = lambda: self._write_dq(
                    batch,
                    outcomes,
                    lambda: Q.gx_outcomes(self.validator, flagged, self._gx_columns(), max_rows),
                )
            return self._finish_fast_part(batch, counts, fast, gold, cached)
        except BaseException:
            if appending is not None:  # no step may outlive its failed batch
                wait([appending])
            _unpersist(cached)
            raise

    def _finish_fast_part(
        self,
        batch: _Batch,
        counts: Mapping[str, Any],
        fast: dict[str, Callable[[], Any]],
        gold: dict[str, Callable[[], Any]],
        cached: list[DataFrame],
    ) -> _GoldPart:
        """Note the batch's counts; with ``defer_gold`` run the fast steps; what is left to run."""
        self._last_rows = counts["dq_rows"]
        batch.report.passed, batch.report.quarantined = counts["passed"], counts["quarantined"]
        if self.defer_gold:
            self._run_steps(batch, fast)
        batch.report.written = batch.out.results  # the gold part's writes join it when they are done
        if not self.defer_gold:  # nothing is visible before the call returns: every step at once
            return _GoldPart(self, batch, {**fast, **gold}, cached)
        self.reports.append(batch.report)
        return _GoldPart(self, batch, gold, cached, reported=True)

    def _run_steps(self, batch: _Batch, steps: Mapping[str, Callable[[], Any]]) -> None:
        """Run the steps concurrently (each Spark job is mostly fixed overhead); re-raise a failure.

        Every step ends before this returns or raises: the caller releases the cached DataFrames the steps
        read, and a step still running must not write after its batch failed. The failure raised is the
        first one that happened (a later one may only follow from it); the batch is then replayed.
        """
        if len(steps) == 1:
            [(name, work)] = steps.items()
            batch.step(name, work)
            return
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

    def _expects_small_batch(self) -> bool:
        """After a small batch the next is likely small too; not a first batch, nor one after a large one."""
        return self._last_rows is not None and self._last_rows <= SMALL_BATCH_ROWS

    def _configure_session(self, spark: SparkSession) -> None:
        """Set :data:`BATCH_SQL_CONF`, and :data:`LARGE_BATCH_SQL_CONF` unless the batch is expected small
        (over the session's own values, which ``close`` sets back).

        Set at every batch: a streaming query hands each batch a new handle on its own session.
        """
        if self._session_conf is None:
            keys = [*BATCH_SQL_CONF, *LARGE_BATCH_SQL_CONF]
            self._session_conf = {key: spark.conf.get(key, None) for key in keys}
        chosen = BATCH_SQL_CONF if self._expects_small_batch() else {**BATCH_SQL_CONF, **LARGE_BATCH_SQL_CONF}
        _set_conf(spark, {**self._session_conf, **chosen})
        self._configured = spark

    def _collects_bronze(self) -> bool:
        """Whether the batch's bronze rows are collected to the driver and appended by delta-rs there
        (while the profile runs): with delta-rs, unless bronze is in ``tables.executor_writes`` and the
        batch is not expected small.

        Collecting a catch-up batch of 100,000 rows as Arrow and writing it with delta-rs took about half
        the time and CPU of writing it from the tasks (Spark's rows cross to Python workers there); a
        micro-batch of a few hundred rows, several times less.
        """
        if self.store.backend != "delta-rs":
            return False
        return self._expects_small_batch() or "bronze_telemetry" not in self.config.tables.executor_writes

    def _rows_in_driver(self) -> bool:
        """Whether the batch is collected to the driver in one Spark job and every table's rows computed
        there with Arrow (:meth:`_driver_fast_part`): with delta-rs, when neither bronze nor silver is
        written from the tasks, and for what the Arrow steps compute as Spark does (devices from telemetry
        only, with string attributes; expectations named apart; GX on pandas).

        A catch-up batch of 100,000 rows ran six Spark jobs the other way (bronze's collect, the profile,
        silver's deduplication, the GX sample, devices); here one, and the driver's Arrow work is a few
        hundred milliseconds of it.
        """
        tables = self.config.tables.executor_writes
        on_tasks = "bronze_telemetry" in tables or "silver_telemetry" in tables
        payload, quality = self.config.payload, self.config.quality
        return (
            self.store.backend == "delta-rs"
            and not on_tasks
            and driver_devices.supported(self.config.gold.devices, self.column_types)
            and driver_rows.supported(quality.suites)
            and quality.gx.engine == "pandas"
            and not set(payload.fields) & set(T.PARSED_RECORD_COLUMNS)
        )

    def _minutes_in_driver(self) -> bool:
        """Whether device_minute is computed with Arrow in the driver (:mod:`.driver_minutes`) from the
        silver rows collected for silver's own append: with delta-rs, unless silver is written from the
        tasks. That spares a Spark query (a scan of stored silver, a shuffle, a collect) per batch."""
        executor_written = "silver_telemetry" in self.config.tables.executor_writes
        return self.store.backend == "delta-rs" and not executor_written

    # -- silver, quarantine and device_minute ------------------------------------------------------------

    def _already_written(self, name: str, out: BatchWriter) -> bool:
        committed = self.store.committed_batch(name, out.app_id) if self.store.exists(name) else None
        return committed is not None and committed >= out.batch_id

    def _stored_range(self, low_us: int, high_us: int) -> TimeRange:
        """The event times of stored silver a batch with these event times compares with: its dedup
        window and its whole minutes (so a read opens the files of those times only)."""
        dedup = self.config.dedup
        window_us = dedup.window_seconds * 1_000_000 if dedup.message_id_fields else 0
        minutes = _whole_minutes(low_us, high_us)
        return TimeRange(
            "event_time", min(low_us - window_us, minutes.low_us), max(high_us + window_us, minutes.high_us)
        )

    def _silver_before(self, passed: DataFrame, within: TimeRange, replayed: bool) -> DataFrame:
        """Silver as it was before this batch, ``within`` its event times: a snapshot taken before this
        batch's silver append starts.

        When an earlier attempt of the batch already appended to silver (``replayed``), its records are
        taken out again (a row cannot be a duplicate of itself, and a minute must not count it twice);
        otherwise the snapshot cannot hold them, and that join over the batch's keys is not needed.
        """
        stored = self.store.read("silver_telemetry", within)
        return T.without_records_of(stored, passed) if replayed else stored

    def _silver_rows(self, passed: DataFrame, before: DataFrame, low_us: int, high_us: int) -> DataFrame:
        """This batch's silver rows: duplicates dropped within the batch and against silver before it."""
        dedup = self.config.dedup
        rows = T.drop_duplicates_in_batch(passed, dedup.message_id_fields, dedup.window_seconds)
        if dedup.message_id_fields:
            window_us = dedup.window_seconds * 1_000_000
            stored = before.where(T.event_time_between(low_us - window_us, high_us + window_us))
            rows = T.drop_already_stored(rows, stored, dedup.message_id_fields, dedup.window_seconds)
        return T.to_silver(rows, list(self.config.payload.silver_fields))

    def _write_silver(
        self, out: BatchWriter, silver_rows: Callable[[], DataFrame | pa.Table], replayed: bool
    ) -> None:
        if replayed:  # spare computing rows the store would skip
            out.results["silver_telemetry"] = False
            return
        out.append("silver_telemetry", silver_rows())

    def _write_device_minute(
        self, batch: _Batch, silver_rows: DataFrame, before: DataFrame, low_us: int, high_us: int
    ) -> None:
        """Recompute every minute the batch's silver rows fall in, from silver as it is with them, and merge.

        "Silver with this batch's rows" is silver before the batch plus the rows, which holds whether
        silver's append (running concurrently) or an earlier attempt's has landed or not (a row
        deduplicated away is in neither). A recomputed row does not depend on what the table held before,
        so merging it twice changes nothing, and late data just recomputes its minute.
        """
        minutes = _whole_minutes(low_us, high_us)
        stored = before.where(T.event_time_between(minutes.low_us, minutes.high_us))
        metrics = self.config.gold.minute_metrics
        rows = T.touched_minute_aggregates(stored, silver_rows, metrics, batch.now)
        # event_date (a function of minute) in the match lets the merge read only the touched partitions.
        batch.out.merge("device_minute", rows, keys=("event_date", "device_id", "minute"))

    def _write_device_minute_in_driver(
        self, batch: _Batch, silver_rows: _Collected, stored: pa.Table, replayed: bool
    ) -> None:
        """:meth:`_write_device_minute` computed with Arrow: ``stored`` is silver's whole minutes of the
        batch, read before its silver append could land (less the batch's own records on a replay)."""
        rows = silver_rows()
        if replayed:
            stored = driver_minutes.without_records_of(stored, rows)
        self._merge_device_minute(batch, stored, rows)

    def _merge_device_minute(self, batch: _Batch, stored: pa.Table, silver_rows: pa.Table) -> None:
        """Merge the minutes ``silver_rows`` touch, recomputed with ``stored`` (silver before the batch,
        its whole minutes) in the driver."""
        metrics = self.config.gold.minute_metrics
        minutes = driver_minutes.touched_minute_aggregates(stored, silver_rows, metrics, batch.now)
        batch.out.merge("device_minute", minutes, keys=("event_date", "device_id", "minute"))

    # -- devices -----------------------------------------------------------------------------------------

    def _write_devices(self, batch: _Batch, bronze: DataFrame, passed: DataFrame) -> None:
        """Upsert the devices seen (:meth:`_merge_devices`), from the telemetry and the status rows."""
        devices = self.config.gold.devices
        sightings = T.telemetry_sightings(passed, devices)
        if devices.status_template is not None:
            sightings = sightings.unionByName(T.parse_status(bronze, devices))
        self._merge_devices(batch, T.device_updates(sightings, batch.now))

    def _merge_devices(self, batch: _Batch, updates: DataFrame | pa.Table) -> None:
        """Merge ``devices`` rows; ``last_seen`` only moves forward, known attributes are kept.

        An attribute the batch does not carry (null) keeps its stored value inside the merge itself, so
        the stored table is not read into Spark first.
        """
        columns = updates.columns if isinstance(updates, DataFrame) else updates.column_names
        batch.out.merge(
            "devices",
            updates,
            update_when="s.last_seen >= t.last_seen",
            update_set=T.device_update_set(columns),
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
    for index, name in enumerate(tables.executor_writes):
        if name not in TABLES:
            raise ConfigError(f"tables.executor_writes[{index}]", f"{name!r} is not a table of this pipeline")
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
    defer_gold: bool | None = None,
) -> StreamingQuery:
    """Start the streaming query (source → foreachBatch); the caller waits for or stops it, then closes
    ``batch`` (the tables are complete once that returns). ``defer_gold`` (default: True, at any trigger)
    sets ``batch.defer_gold``: a batch's gold part overlaps the next batch's fast part, which took a
    catch-up of 100,000-row batches about a sixth less CPU and a third less time than every step of a
    batch at once."""
    from sources import register_sources

    register_sources(spark)
    # Spark purges the checkpoint's offsets and commits older than this many batches as the query runs
    spark.conf.set(MIN_BATCHES_TO_RETAIN_CONF, str(config.tables.maintenance.checkpoint_batches))
    options = dict(config.source_options())
    options.update(source_options or {})
    if available_now:
        options.update(available_now_run.source_options(spark))
    records = spark.readStream.format("timestone").options(**options).load()
    batch.defer_gold = True if defer_gold is None else defer_gold
    writer = (
        records.writeStream.queryName(config.stream.query_name)
        .option("checkpointLocation", config.stream.checkpoint)
        .foreachBatch(exactly_once(batch.store, batch, persist=False))  # the batch caches bronze itself
    )
    batch.resume(config.stream.checkpoint)
    if available_now:
        return available_now_run.start(writer, spark)
    return writer.trigger(processingTime=config.stream.trigger_interval).start()


def maintenance_target(spark: SparkSession | None, config: TelemetryConfig) -> MaintenanceTarget:
    """The tables ``timestone tables maintain telemetry`` maintains, and how (``tables.maintenance``)."""
    return MaintenanceTarget(open_store(spark, config), TABLES, config.tables.maintenance)


def validate(section: Any) -> TelemetryConfig:
    """Check the ``telemetry`` config section (raises ConfigError naming the field) before Spark starts:
    every key, the source's options, the trigger, and the places it writes."""
    config = load_telemetry_config(section)
    check_output_location(config.tables.root, "telemetry.tables.root")
    check_output_location(config.stream.checkpoint, "telemetry.stream.checkpoint")
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
    batches: list[TelemetryBatch] = []
    maintenance = MaintenanceScheduler(store, TABLES, config.tables.maintenance)

    def start() -> StreamingQuery:
        batch = make_batch(config, store)
        batch.share_maintenance(maintenance)
        batch.ensure_tables()
        batches.append(batch)
        query = start_query(spark, config, batch, available_now=available_now)
        log.info("telemetry query %s started: tables at %s (%s)", query.id, config.tables.root, store.backend)
        return query

    def ended(query: StreamingQuery) -> None:
        batches.pop().close()

    supervisor.add(config.stream.query_name, start, ended)
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


def last_committed_batch(checkpoint: str) -> tuple[str, int] | None:
    """The query id and last committed batch id in a streaming checkpoint on the local file system."""
    path = checkpoint.removeprefix("file:")
    if "://" in path:
        return None
    root = Path(path)
    try:
        query_id = json.loads((root / "metadata").read_text().splitlines()[0])["id"]
        batch_ids = [int(f.name) for f in (root / "commits").iterdir() if f.name.isdigit()]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    return (query_id, max(batch_ids)) if batch_ids else None


class _Collected:
    """A DataFrame collected to Arrow once, by whichever step needs it first (steps run concurrently)."""

    def __init__(self, frame: DataFrame) -> None:
        self._frame = frame
        self._lock = threading.Lock()
        self._table: pa.Table | None = None

    def __call__(self) -> pa.Table:
        with self._lock:
            if self._table is None:
                self._table = self._frame.toArrow()
            return self._table


def _ms_since(began: float) -> float:
    return round(1000 * (time.perf_counter() - began), 1)


def _whole_minutes(low_us: int, high_us: int) -> TimeRange:
    """From the start of ``low_us``'s minute to the start of the minute after ``high_us``'s."""
    minute_us = 60_000_000
    return TimeRange("event_time", low_us - low_us % minute_us, high_us - high_us % minute_us + minute_us)


def _set_conf(spark: SparkSession, conf: Mapping[str, str | None]) -> None:
    """Set the session's SQL settings to ``conf`` (None: unset)."""
    for key, value in conf.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def _unpersist(frames: list[DataFrame]) -> None:
    for frame in frames:
        frame.unpersist()


def _one_row(frame: DataFrame) -> Row:
    """The row of an aggregate without grouping (there is always exactly one)."""
    row = frame.first()
    assert row is not None, "an aggregate without grouping has one row"
    return row
