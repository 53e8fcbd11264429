"""The actions job on Spark: two streams and a clock feeding one :class:`ActionsEngine`.

- ``actions`` change feed → new actions are fanned out, a ``cancel`` update stops one
  (native Delta streaming with ``readChangeFeed`` where the session has Delta; here the ``delta_cdf`` source);
- device status reports from the brokers' logs (the ``timestone`` source) → executions and summaries: from
  each of separate brokers, or once from a cluster (``reports.py``);
- a ticker thread → paced rollouts, timeouts, aborts.

Spark checkpoints hold both streams' offsets; every table write is idempotent per (query, batch), so a
replayed micro-batch changes nothing. Publishing is at least once: a replay may publish an action again, and
a device answers an action id it has already seen with its latest report again, never starting it twice.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from broker_edge.config.endpoints import BrokerEndpoint, format_endpoints
from broker_edge.security.client_tls import ClientTls
from pipelines.actions.arrow_rows import python_rows
from pipelines.actions.cluster import brokers_form_a_cluster
from pipelines.actions.config import ActionsConfig
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.engine_tables import ACTIONS, COMPLIANCE, EXECUTIONS, SUMMARY
from pipelines.actions.heartbeat import HeartbeatWriter
from pipelines.actions.publisher import ClusterPublisher, MqttPublisher, Publisher
from pipelines.actions.report_scope import SHOWN
from pipelines.actions.reports import (
    CLUSTER_BROKER_ID,
    BrokerReports,
    ClusterReports,
    ReportStream,
    fold_batch,
)
from pipelines.maintenance.config import MIN_BATCHES_TO_RETAIN_CONF, MaintenanceTarget
from pipelines.maintenance.scheduler import MaintenanceScheduler
from pipelines.metrics import PipelineMetrics
from pipelines.output_paths import check_backend, check_checkpoint, check_output_location, check_table_root
from pipelines.spark_session import stop_between_batches
from pipelines.supervisor import GaveUp, SupervisedQuery, Supervisor
from sinks.backends import Backend, open_table_store
from sinks.foreach_batch import streaming_query_id
from sinks.store import TableStore
from sources import register_sources
from sources.options import tls_options

if TYPE_CHECKING:
    from pipelines.run_options import RunOptions

log = logging.getLogger(__name__)

#: The tables the job maintains: those it writes, and the actions table whose change feed it reads.
MAINTAINED = (ACTIONS, EXECUTIONS, SUMMARY, COMPLIANCE)
#: What the job reads of a report's record: the report, when the broker appended it (the report's time), and
#: its topic (a device's own topic binds the device it names) and its publisher's client id (report_identity).
REPORT_COLUMNS = ("payload", "timestamp", "topic", "client_id")
#: The job's two streaming queries, each checkpointed in its own directory under ``checkpoint_root``.
REPORTS_QUERY, FANOUT_QUERY = QUERIES = ("reports", "fanout")


def _action_changes(spark: SparkSession, store: TableStore) -> DataFrame:
    location = store.location(ACTIONS)
    if store.backend == "native":
        reader = spark.readStream.format("delta").option("readChangeFeed", "true")
        stream = reader.option("startingVersion", "0").load(location)
    else:
        reader = spark.readStream.format("delta_cdf").option("path", location).option("startingVersion", "0")
        stream = reader.load()
    return stream.where(F.col("_change_type").isin("insert", "update_postimage"))


def _status_reports(
    spark: SparkSession, config: ActionsConfig, endpoints: Sequence[BrokerEndpoint], cluster: bool
) -> DataFrame:
    reader = (
        spark.readStream.format("timestone")
        .options(**tls_options(config.tls))
        .option("topics", config.status_topics)
        .option("startingOffsets", "earliest")
        .option("maxTopicsPerPartition", config.report_topics_per_task)
    )
    if config.sites:  # a hub: each site's reports, under $site/<site_id>/ (docs/uplink.md)
        reader = reader.option("sites", "true")
    if cluster:  # the source finds each topic's replicas and reads a dead member's ranges from another
        reader = reader.option("bootstrapServers", ",".join(b.offsets_api for b in endpoints))
        reader = reader.option("clusterName", CLUSTER_BROKER_ID).option("fetchTimeoutMs", 5000)
        token = next((b.token for b in endpoints if b.token), None)
        return (reader.option("authToken", token) if token else reader).load().select(*REPORT_COLUMNS)
    reader = reader.option("brokers", format_endpoints(endpoints))
    for broker in endpoints:
        if broker.token:
            reader = reader.option(f"authToken.{broker.name}", broker.token)
    return reader.load().select(*REPORT_COLUMNS)


@dataclass
class ActionsJob:
    """The running job: its two queries (restarted from their checkpoints when they fail), the ticker that
    also watches them and maintains the tables; :meth:`stop` ends all of them."""

    engine: ActionsEngine
    reports: ReportStream
    supervisor: Supervisor
    maintenance: MaintenanceScheduler
    heartbeat: HeartbeatWriter | None = None
    """Tells ``timestone ota status`` that a job acts on these tables (``heartbeat.py``)."""
    trigger_interval_s: float = 1.0
    """The streams' trigger interval: how far behind the reports stream may be when it has caught up."""
    _fanout: SupervisedQuery | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _ticker: threading.Thread | None = None

    @property
    def fanout(self) -> StreamingQuery | None:
        """The fanout query running now (None from its failure until its restart)."""
        return self._fanout.query if self._fanout is not None else None

    @property
    def queries(self) -> list[StreamingQuery]:
        """The streaming queries running now."""
        return self.supervisor.running()

    @property
    def gave_up(self) -> GaveUp | None:
        """A query that failed in a way a restart cannot fix, once one has."""
        return self.supervisor.gave_up

    def running(self) -> bool:
        """Whether the job goes on: no query failed for good, and not every query was stopped."""
        return self.gave_up is None and not all(w.done for w in self.supervisor.queries)

    def start_ticker(self, interval_s: float) -> None:
        """Every ``interval_s``: the engine's tick, a look at the queries, and table maintenance when due."""
        self._beat()

        def run() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.engine.tick(self._reports_read_until())
                except Exception:  # the next tick retries; a streaming failure is the supervisor's
                    log.exception("actions tick failed")
                if self.supervisor.check() is not None:
                    return  # the job stops (run() sees gave_up)
                self.maintenance.poke()
                self._beat()

        self._ticker = threading.Thread(target=run, name="actions-ticker", daemon=True)
        self._ticker.start()

    def _reports_read_until(self) -> int:
        """Up to when the reports stream has handled every report (``ReportStream.read_until``; 0 until it
        has caught up once): the engine ends no execution as expired past it."""
        return self.reports.read_until(int(time.time() * 1000), int(self.trigger_interval_s * 1000))

    def process_available(self) -> None:
        """Wait until both streams have processed everything available now (tests, demos)."""
        for query in self.queries:
            query.processAllAvailable()

    def stop(self) -> None:
        """Stop the ticker, both queries, the maintenance and the publisher: each of them even when stopping
        another failed (the first failure is raised afterwards), so that no query outlives the job."""
        self._stop.set()
        self.supervisor.stop()
        fanout = self.fanout
        steps = (
            self._join_ticker,
            lambda: stop_between_batches(fanout) if fanout is not None else None,
            self.reports.stop,
            self.maintenance.close,
            self.engine.publisher.close,
        )
        failure: BaseException | None = None
        for step in steps:
            try:
                step()
            except BaseException as error:
                log.exception("stopping the actions job")
                failure = failure or error
        if failure is not None:
            raise failure

    def _join_ticker(self) -> None:
        if self._ticker:
            self._ticker.join(timeout=10)
        try:
            self.engine.refresh_compliance()
        except Exception:  # the table is as the last tick left it; stopping goes on
            log.exception("bringing fleet_compliance up to date")
        self._beat(stopping=True)

    def _beat(self, stopping: bool = False) -> None:
        if self.heartbeat is None:
            return
        try:
            if stopping:
                self.heartbeat.stop()
            else:
                self.heartbeat.beat(self.engine.reports_wait_since)
        except OSError as error:  # status cannot tell whether the job runs; the job itself is fine
            log.warning("cannot write the actions job's heartbeat: %s", error)


def start_actions_job(
    spark: SparkSession,
    config: ActionsConfig,
    store: TableStore | None = None,
    publisher: Publisher | None = None,
    metrics: PipelineMetrics | None = None,
) -> ActionsJob:
    """Start both streams and the ticker; returns at once with the running :class:`ActionsJob`."""
    register_sources(spark)
    backend = cast(Backend, config.backend)  # one of Backend's values, checked by ActionsConfig
    store = store or open_table_store(spark, config.tables_root, backend=backend)
    cluster = config.cluster
    if cluster is None:
        cluster = brokers_form_a_cluster(config.brokers, tls=config.tls)
    publisher = publisher or _publisher(config, cluster)
    engine = ActionsEngine(
        store,
        publisher,
        device_buckets=config.device_buckets,
        compliance_interval_s=config.compliance_interval_s,
        message_expiry_s=config.message_expiry_s,
    )
    counted = metrics or PipelineMetrics()
    checkpoints = Path(config.checkpoint_root)
    trigger = f"{config.trigger_interval_s} seconds"
    # Spark purges the checkpoints' offsets and commits older than this many batches as the queries run
    spark.conf.set(MIN_BATCHES_TO_RETAIN_CONF, str(config.maintenance.checkpoint_batches))

    def fan_out(batch: DataFrame, batch_id: int) -> None:
        ordered = batch.orderBy("_commit_version")
        rows = python_rows(ordered.drop("_commit_timestamp").toArrow())
        engine.on_action_rows(rows, f"fanout/{streaming_query_id(batch)}", batch_id)

    def track(batch: DataFrame, batch_id: int) -> None:
        folded = fold_batch(batch, config.report_identity)  # on the executors: one row per (action, device)
        _count_skipped(counted, folded.not_reports, folded.impostor_count, folded.impostors)
        left_out = engine.on_reports(folded, f"reports/{streaming_query_id(batch)}", batch_id)
        if folded.expanded:
            log.info("reports batch %d: %d devices' reports read one by one", batch_id, folded.expanded)
        for reason, count in left_out.items():
            counted.skipped_reports.labels("actions", reason).inc(count)

    def start_reports(endpoints: Sequence[BrokerEndpoint]) -> StreamingQuery:
        return (
            _status_reports(spark, config, endpoints, cluster)
            .writeStream.queryName("actions-reports")
            .foreachBatch(track)
            .option("checkpointLocation", str(checkpoints / REPORTS_QUERY))
            .trigger(processingTime=trigger)
            .start()
        )

    def start_fanout() -> StreamingQuery:
        return (
            _action_changes(spark, store)
            .writeStream.queryName("actions-fanout")
            .foreachBatch(fan_out)
            .option("checkpointLocation", str(checkpoints / FANOUT_QUERY))
            .trigger(processingTime=trigger)
            .start()
        )

    supervisor = Supervisor("actions", config.restart, counted)
    reports: ReportStream = (ClusterReports if cluster else BrokerReports)(start_reports, config.brokers)
    maintenance = MaintenanceScheduler(store, MAINTAINED, config.maintenance)
    job = ActionsJob(
        engine,
        reports,
        supervisor,
        maintenance,
        HeartbeatWriter(config.tables_root),
        trigger_interval_s=config.trigger_interval_s,
    )
    try:
        job._fanout = supervisor.add("actions-fanout", start_fanout)
        supervisor.add("actions-reports", lambda: reports.start())
    except BaseException:  # no query is left running by a job that failed to start
        try:
            for query in supervisor.running():
                query.stop()
        finally:
            publisher.close()
        raise
    job.start_ticker(config.tick_interval_s)
    return job


def _count_skipped(
    metrics: PipelineMetrics, not_reports: int, impostor_count: int, impostors: list[str]
) -> None:
    """Count and log a batch's status messages that are not reports, and its ``impostor_count`` reports from
    another client than the device they name (``impostors``: some of them, ``"<client id> for <device
    id>"``)."""
    metrics.skipped_reports.labels("actions", "not_a_report").inc(not_reports)
    metrics.skipped_reports.labels("actions", "another_device").inc(impostor_count)
    if not_reports:
        log.warning(
            "skipped %d status messages: not reports, or naming another device than their topic", not_reports
        )
    if impostor_count:
        more = f" and {impostor_count - len(impostors[:SHOWN])} more" if impostor_count > SHOWN else ""
        log.warning(
            "skipped %d status reports naming another device than the client that sent them "
            "(report_identity: client_id): %s%s",
            impostor_count,
            ", ".join(impostors[:SHOWN]),
            more,
        )


def _publisher(config: ActionsConfig, cluster: bool) -> MqttPublisher:
    """Once through any live member of a cluster, or to each of separate brokers."""
    addresses = [(b.mqtt_host, b.mqtt_port) for b in config.brokers]
    tls = [mqtt_tls(config, b) for b in config.brokers]
    first = config.brokers[0]
    kind = ClusterPublisher if cluster else MqttPublisher
    return kind(addresses, username=first.username, password=first.password, tls=tls)


def mqtt_tls(config: ActionsConfig, broker: BrokerEndpoint) -> ssl.SSLContext | None:
    """The TLS of the job's MQTT connections to ``broker`` (None: plain MQTT)."""
    if not broker.mqtt_tls:
        return None
    return (config.tls or ClientTls()).context()


def maintenance_target(spark: SparkSession | None, config: ActionsConfig) -> MaintenanceTarget:
    """The tables ``timestone tables maintain actions`` maintains, and how (``maintenance``)."""
    store = open_table_store(spark, config.tables_root, backend=cast(Backend, config.backend))
    return MaintenanceTarget(store, MAINTAINED, config.maintenance)


def validate(section: object) -> ActionsConfig:
    """Check the actions config (raises ConfigError naming the field) before Spark starts, with the places
    it writes."""
    from broker_edge.config import load_dataclass

    config = load_dataclass(ActionsConfig, section or {})
    check_backend(config.backend, "backend")
    check_output_location(config.tables_root, "tables_root")
    check_table_root(config.tables_root, "tables_root")
    check_output_location(config.checkpoint_root, "checkpoint_root")
    for query in QUERIES:
        checkpoint = str(Path(config.checkpoint_root) / query)
        check_checkpoint(checkpoint, "checkpoint_root", 'docs/ota.md, "Exactly once, where it matters"')
    return config


def preflight(config: ActionsConfig, options: object) -> None:
    """Before Spark starts: whether the brokers form a cluster, when the config does not say (a mix is a
    ConfigError, no answer at all ``BrokersUnreachable``)."""
    if config.cluster is None:
        brokers_form_a_cluster(config.brokers, tls=config.tls)


def run(spark: SparkSession, section: object, options: RunOptions) -> int:
    """``timestone pipeline actions``: run the job until interrupted or a query fails for good."""
    config = validate(section)
    job = start_actions_job(spark, config, metrics=options.metrics)
    log.info(
        "actions job started: tables at %s, brokers %s", config.tables_root, [b.name for b in config.brokers]
    )
    try:
        while job.running():
            time.sleep(1)
        return job.gave_up.exit_status if job.gave_up is not None else 0
    except KeyboardInterrupt:
        log.info("stopping the actions job")
        return 0
    finally:
        job.stop()
