"""The ``timestone`` Spark streaming source: glue between Spark, the offsets API client and the planner.

Spark runs ``initialOffset`` / ``latestOffset`` / ``partitions`` / ``commit`` in one long-lived Python process
per query (not the driver), and ``read`` in executor workers on a freshly unpickled reader. So the reader
keeps only caches in memory (the last listings, how each broker is read), the checkpointed offsets carry the
state, and each ``TimestonePartition`` carries everything its task needs.

A standalone broker is read by storage partition (``{broker id: {"#p0": position, ...}}``, see
``partition_offsets``) when it serves partition reads and the query starts at ``earliest``, ``latest`` or a
time (``readBy=partitions``, the default); otherwise, and for a query whose checkpoint has them, by topic
offsets (``{broker id: {topic: next offset}}``). A cluster is read by topic offsets (``{cluster name: {topic:
next offset}}``). A standalone broker's offsets also name the store they were taken from (``#s<store id>``):
a wiped or replaced store is refused or read from its start (``broker_stores``). Rules live elsewhere:
planning in ``offsets_planner``, options in ``options``, fetching in ``slice_reader`` and
``partition_reader``; for a cluster, listing in ``cluster_listing``, routing in ``cluster_plan`` and fetching
from live replicas in ``cluster_reader``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker_edge.offsets_api.client import OffsetsApiError, OffsetsClient
from broker_edge.offsets_api.errors import UnknownTopicError

from .broker_stores import batch_bounds, resumed_start, store_of, with_stores
from .cluster_listing import ClusterLister, ClusterListing
from .cluster_plan import by_reader
from .cluster_reader import ClusterFetch, read_cluster_slices
from .listed_filters import appeared, with_listed, without_listed
from .offsets_planner import (
    BatchPlan,
    LogExtent,
    PartitionPlan,
    RestartedLog,
    batch_topics,
    behind,
    canonical,
    check_offsets,
    plan_end_offsets,
    plan_partitions,
    starting_offsets,
)
from .options import SourceOptionError, SourceOptions, StartingOffsets, StartKind, parse_options
from .partition_offsets import (
    FILTER_PREFIX,
    REMOVED_POSITIONS,
    describe,
    drop_passed_marks,
    filter_keys,
    filters_of,
    first_batch_marks,
    holds_positions,
    is_partition_key,
    marks_of,
    partition_of,
    position_key,
    query_start_marks,
    reads_partitions,
    uncovered,
    without_marks,
)
from .partition_reader import read_positions
from .removed_topics import RemovedTopics, past_removed, removed_topics
from .slice_reader import (
    BrokerAnswerError,
    BrokerAuthError,
    BrokerUnreachableError,
    FetchSettings,
    read_slices,
)
from .stream_api import BatchStarts, ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from .topic_cover import listing
from .unmatched_topics import BrokerWay, say_if_nothing_matches

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SCHEMA", "TimestoneDataSource", "TimestonePartition", "TimestoneStreamReader"]

log = logging.getLogger(__name__)

SCHEMA = StructType(
    [
        StructField("broker", StringType()),
        StructField("topic", StringType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("client_id", StringType()),
        StructField("qos", IntegerType()),
        StructField("retain", BooleanType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("payload", BinaryType()),
    ]
)

Listings = dict[str, dict[str, LogExtent]]


_START_WORDS = {StartKind.LATEST: "'latest'", StartKind.TIMESTAMP: "at a time", StartKind.SPECIFIC: "as JSON"}
"""How a refusal names a start that needs every broker's listing."""


class TimestonePartition(InputPartition):
    """One Spark task: slices of one broker's logs (or a cluster's: ``cluster``), and how to fetch them.

    Slices of a broker read by partition are position ranges, read with the query's ``patterns`` and the
    partitions' query-start ``marks`` (see ``partition_reader``)."""

    def __init__(
        self,
        plan: PartitionPlan,
        fetch: FetchSettings,
        cluster: ClusterFetch | None = None,
        patterns: tuple[str, ...] = (),
        marks: dict[int, int] | None = None,
    ) -> None:
        super().__init__(None)
        self.plan = plan
        self.fetch = fetch
        self.cluster = cluster
        self.patterns = patterns
        self.marks = marks or {}

    def __repr__(self) -> str:  # InputPartition's repr lists every attribute; keep the token out of logs
        return f"TimestonePartition({self.plan!r}, url={self.fetch.url!r})"


class TimestoneDataSource(DataSource):
    """``spark.readStream.format("timestone")``: MQTT records from Timestone brokers' commitlogs.

    ``default_min_partitions`` is what ``minPartitions`` means when the option is not given. The planner
    runs in a Python process that cannot ask Spark for its parallelism, so :meth:`for_session` (used by
    ``sources.register_sources``) bakes the session's ``defaultParallelism`` into a subclass; the class
    registered as it is falls back to the CPU count of the machine planning the query.
    """

    default_min_partitions: int | None = None

    @classmethod
    def name(cls) -> str:
        return "timestone"

    @classmethod
    def for_session(cls, spark: SparkSession) -> type[TimestoneDataSource]:
        """This source with ``spark``'s ``defaultParallelism`` as the default of ``minPartitions``."""
        try:
            parallelism = spark.sparkContext.defaultParallelism
        except Exception:  # Spark Connect sessions have no SparkContext: keep the fallback
            return cls
        # A class built here is pickled by value when registered, so the number travels with it.
        attributes = {"default_min_partitions": parallelism, "__module__": cls.__module__}
        return type(cls.__name__, (cls,), attributes)

    def schema(self) -> StructType:
        parse_options(self.options)  # fail at load(), naming the option, rather than at query start
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TimestoneStreamReader(self._options())

    def reader(self, schema: StructType) -> DataSourceReader:
        """``spark.read``: what the brokers hold now, from ``startingOffsets`` (``earliest`` if not given)."""
        from .batch_reader import TimestoneBatchReader

        options = self._options()
        if "startingoffsets" not in {key.lower() for key in self.options}:
            options = replace(options, starting_offsets=StartingOffsets(StartKind.EARLIEST))
        return TimestoneBatchReader(TimestoneStreamReader(options))

    def _options(self) -> SourceOptions:
        options = parse_options(self.options)
        if options.min_partitions is None:
            options = replace(options, min_partitions=self.default_min_partitions or os.cpu_count() or 1)
        return options


class TimestoneStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets, planning and reading of one query (see the module docstring for where each part runs)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        # Reading a cluster, the one "broker" is the cluster (its URL: the first bootstrap member).
        sources = (
            [(options.cluster_name, options.bootstrap_servers[0], options.auth_token)]
            if options.reads_cluster
            else [(endpoint.name, endpoint.offsets_api, endpoint.token) for endpoint in options.brokers]
        )
        self._fetch = {
            name: FetchSettings(
                name,
                url,
                token,
                options.fetch_timeout_ms,
                options.fetch_retries,
                options.retry_backoff_ms,
                options.max_bytes_per_fetch,
                options.fail_on_data_loss,
                "the option authToken (shared by the cluster's members)" if options.reads_cluster else None,
                options.sites,
                tls=options.tls,
            )
            for name, url, token in sources
        }
        self.__setstate__({})

    def __getstate__(self) -> dict[str, object]:
        return {"options": self.options, "_fetch": self._fetch}  # no clients or caches travel to executors

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._clients: dict[str, OffsetsClient] = {}
        self._listings: Listings = {}
        self._down: set[str] = set()
        self._target: dict[str, dict[str, int]] | None = None
        self._target_by_partition: dict[str, bool | None] = {}
        self._by_partition: dict[str, bool] = {}
        """How each broker is read (True: by partition): from its checkpointed offsets, or on listing."""
        self._stores: dict[str, str | None] = {}
        """Each standalone broker's store identity at its last listing (``broker_stores``)."""
        self._lister: ClusterLister | None = None
        self._cluster: ClusterListing | None = None
        self._initial: dict | None = None
        """The query's starting offsets, once computed (Spark may ask again: the answer must not move)."""
        self._planned: dict | None = None
        """The end offsets the last ``latestOffset`` returned (``reportLatestOffset``)."""
        self._starts = BatchStarts()
        self._told_unnamed: set[str] = set()
        """The checkpoint's brokers ``brokers`` does not name that a warning has said so."""
        self._matches_looked_for = False
        """Whether this run looked for a log option ``topics`` matches (``_say_if_nothing_matches``)."""

    # -- offsets: the long-lived planner process ---------------------------------------------------------

    def initialOffset(self) -> dict:
        if self._initial is None:
            self._initial = self._initial_offsets()
        return self._initial

    def _initial_offsets(self) -> dict:
        start = self.options.starting_offsets
        listings, down = self._list_all()
        if down and start.kind is not StartKind.EARLIEST:
            # Where "latest" (or a time) is on a broker that does not answer is unknowable, and reading its
            # logs from their start later would not be what was asked for. "earliest" needs nothing now.
            error = next(iter(down.values()))
            raise error.needed_for(
                f"startingOffsets {_START_WORDS[start.kind]} needs every broker's logs at the query's start "
                "(start the broker, leave it out of the option brokers, or start from 'earliest')"
            ) from error.__cause__  # (the error itself is this one, said without its need)
        for broker, error in down.items():
            log.warning(
                "broker %r is down at query start; its logs will be read from their start: %s", broker, error
            )
        resolved = None
        if start.kind is StartKind.TIMESTAMP:
            assert start.timestamp_ms is not None
            resolved = self._offsets_for_timestamp(listings, start.timestamp_ms)
        offsets = starting_offsets(start, listings, resolved)
        for broker, keys in offsets.items():
            if self._by_partition.get(broker):
                keys.update(query_start_marks(keys, listings[broker]))
        offsets = with_listed(self._with_filters(offsets), {}, self._listed(listings), self.options.topics)
        return canonical(with_stores(offsets, {}, self._stores_of(listings)))

    @property
    def brokers_down(self) -> set[str]:
        """The brokers that did not answer their last listing."""
        return set(self._down)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        listings, down = self._list_all()
        for broker, error in down.items():
            log.warning("broker %r is down: this availableNow run does not read it: %s", broker, error)
        self._target = _ends(listings)
        self._target_by_partition = {broker: self._by_partition.get(broker) for broker in listings}

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        if start is None:  # Spark 4.0 and 4.1 give neither (sources/stream_api.py)
            start, limit = self._starts.start(self.initialOffset), self.getDefaultReadLimit()
        if self.options.end_at_query_start and self._target is None:
            self.prepareForTriggerAvailableNow()
        check_offsets(start)
        self._check_checkpoint(start)
        self._note_how_read(start)
        self._check_filters(start)
        listings, down = self._list_all()
        self._check_names(start)
        self._say_if_nothing_matches(listings)
        for broker, error in down.items():
            log.warning(
                "broker %r is down: its offsets stay where they are for this batch: %s", broker, error
            )
        if self._target is not None:  # a broker listed before its checkpoint said how it is read
            for broker, logs in listings.items():
                if broker in self._target and self._target_by_partition[broker] != self._by_partition[broker]:
                    self._target[broker] = _ends({broker: logs})[broker]
                    self._target_by_partition[broker] = self._by_partition[broker]
        current = self._stores_of(listings)
        resumed = self._past_removed(resumed_start(start, current, self.options.fail_on_data_loss))
        listed = self._listed(listings, self._target)
        end = plan_end_offsets(
            without_listed(resumed),
            listings,
            max_records=limit.max_rows if isinstance(limit, ReadMaxRows) else None,
            fail_on_data_loss=self.options.fail_on_data_loss,
            target=self._target,
            end_may_lag=self.options.reads_cluster,
            appeared=appeared(resumed, {broker: listings[broker] for broker in listed}),
        )
        for broker in listings:  # new to the query: what it held when first listed is not loss
            if self._by_partition.get(broker) and not holds_positions(resumed.get(broker, {})):
                end[broker] = end.get(broker, {}) | query_start_marks(end.get(broker, {}), listings[broker])
        end = self._with_filters({broker: drop_passed_marks(keys) for broker, keys in end.items()})
        end = with_stores(with_listed(end, resumed, listed, self.options.topics), start, current)
        end = canonical(end)  # (sorted once, complete: Spark tells "no new data" by the JSON)
        self._starts.ended(end)
        self._planned = end
        return end

    def reportLatestOffset(self) -> dict | None:
        """The latest offsets of the logs the batch just planned leaves records behind in (Spark 4.2+ asks
        right after ``latestOffset``, for the query's progress): ``{}`` when it reads everything listed."""
        if not self._listings or self._planned is None:
            return None
        return behind(self._listings, self._planned)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        check_offsets(start)
        check_offsets(end)
        self._starts.ended(end)
        if self.options.reads_cluster:
            return self._cluster_partitions(start, end)
        # A batch replayed after a restart is planned before any latestOffset: list what is not cached.
        self._note_how_read(end)
        missing = [broker for broker in end if broker in self._fetch and broker not in self._listings]
        if missing:
            self._list_all(missing)
        start, end = batch_topics(start, end, self._listings)  # (the topics it moves: a few of thousands)
        start, planned = batch_bounds(start, end, self._stores, self.options.fail_on_data_loss)
        start = self._past_removed(start, say=True)
        planned = without_listed({broker: keys for broker, keys in planned.items() if broker in self._fetch})
        plan = plan_partitions(
            without_marks(without_listed(start)),
            without_marks(planned),
            self._listings,
            max_records_per_partition=self.options.max_records_per_partition,
            fail_on_data_loss=self.options.fail_on_data_loss,
            min_partitions=self.options.min_partitions or 1,
            max_slices_per_partition=self.options.max_topics_per_partition,
            appeared=appeared(start, planned),
        )
        _warn_lost(plan)
        return [
            TimestonePartition(
                partition,
                replace(self._fetch[partition.broker], store=store_of(end[partition.broker])),
                patterns=self.options.topics,
                marks=_marks(start.get(partition.broker, {}), planned[partition.broker]),
            )
            for partition in plan.partitions
        ]

    def _cluster_partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """The batch cut per member: each topic goes to the member its listing came from (see cluster_plan).

        A replayed batch is planned from a fresh listing: the same records, maybe from other members."""
        name = self.options.cluster_name
        if self._cluster is None:
            _, down = self._list_all()
            if down and start.get(name, {}) == end.get(name, {}):
                return []  # nothing to read: the stream waits for the cluster, as for a standalone broker
            if down:
                raise down[name]
        assert self._cluster is not None
        layout, routes = self._cluster
        extents = {topic: route.extent for topic, route in routes.items()}
        start, end = batch_topics(start, end, {name: extents})
        begun, ended = without_listed(start).get(name, {}), without_listed(end).get(name, {})
        new = appeared(start, {name: ended}).get(name, set())
        plan = plan_partitions(
            by_reader(begun, routes, layout),
            by_reader(ended, routes, layout),
            by_reader(extents, routes, layout),
            max_records_per_partition=self.options.max_records_per_partition,
            fail_on_data_loss=self.options.fail_on_data_loss,
            min_partitions=self.options.min_partitions or 1,
            max_slices_per_partition=self.options.max_topics_per_partition,
            end_may_lag=True,
            appeared=by_reader(dict.fromkeys(new, 0), routes, layout),
        )
        _warn_lost(plan)
        fetch = self._fetch[name]
        bootstrap = self.options.bootstrap_servers
        return [
            TimestonePartition(
                partition, fetch, ClusterFetch(name, layout, partition.broker, bootstrap, fetch)
            )
            for partition in plan.partitions
        ]

    def _check_checkpoint(self, start: dict) -> None:
        """A checkpoint keyed by broker ids cannot continue as a cluster's (or the other way round)."""
        if not self.options.reads_cluster:
            return
        foreign = sorted(key for key in start if key != self.options.cluster_name)
        if foreign:
            raise ValueError(
                f"timestone source: the checkpoint holds offsets of {', '.join(map(repr, foreign))}, not of "
                f"the cluster {self.options.cluster_name!r} (option clusterName): a query reading a cluster "
                "through bootstrapServers needs its own checkpoint, or the clusterName it was started with"
            )

    def _check_names(self, start: dict) -> None:
        """A checkpoint's broker that ``brokers`` no longer names: renamed (its store answers under a new
        id, which would read it all again) is refused; left out (its offsets kept, not read) is said once."""
        if self.options.reads_cluster:
            return
        for broker in sorted(set(start) - set(self._fetch)):
            store = store_of(start[broker])
            renamed = [
                name for name, now in self._stores.items() if store and now == store and name not in start
            ]
            if renamed:
                url = self._fetch[renamed[0]].url
                raise SourceOptionError(
                    "brokers",
                    f"names broker {renamed[0]!r} ({url}), which serves store {store} that the checkpoint's "
                    f"offsets hold under {broker!r}: renamed, it would be read again "
                    f"from its start under its new id. Name it {broker!r} again, or start the query on a new "
                    "checkpoint",
                )
            if broker not in self._told_unnamed:
                self._told_unnamed.add(broker)
                log.warning(
                    "timestone source: the checkpoint holds offsets of broker %r, which the option brokers "
                    "does not name: its records past them are not read (the offsets are kept, for when it is "
                    "named again)",
                    broker,
                )

    def _check_filters(self, start: dict) -> None:
        """A broker read by partition cannot read a filter its checkpoint did not below its positions: fail
        (``failOnDataLoss``) or say so and read that filter from there on."""
        for broker, keys in start.items():
            read = filters_of(keys) if self._by_partition.get(broker) else None
            added = uncovered(self.options.topics, read) if read is not None else []
            if not added:
                continue
            problem = (
                f"reads {', '.join(added)}, which broker {broker!r}'s checkpoint (read by storage partition "
                f"with {', '.join(sorted(read or ()))}) did not: its records below the checkpoint's "
                "positions cannot be read by partition"
            )
            if self.options.fail_on_data_loss:
                raise SourceOptionError(
                    "topics",
                    f"{problem}. Start the query on a new checkpoint to read them, or set "
                    "failOnDataLoss=false to read the added filters from the checkpoint's positions on",
                )
            log.warning("option 'topics' %s; they are skipped (failOnDataLoss=false)", problem)

    def _with_filters(self, offsets: dict) -> dict:
        """``offsets`` with each broker read by partition naming the filters it is read with (not sorted)."""
        named = filter_keys(self.options.topics)
        return {
            broker: _without_filters(keys) | named if self._by_partition.get(broker) else keys
            for broker, keys in offsets.items()
        }

    def commit(self, end: dict) -> None:
        """Nothing to acknowledge: brokers keep no reader state (and Spark calls this late)."""

    def stop(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    # -- reading: executors --------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TimestonePartition)
        if partition.cluster is not None:
            return read_cluster_slices(partition.cluster, partition.plan.slices)
        slices = partition.plan.slices
        if slices and is_partition_key(slices[0].topic):
            return read_positions(partition.fetch, slices, partition.patterns, partition.marks)
        return read_slices(partition.fetch, slices)

    # -- helpers -------------------------------------------------------------------------------------------

    def _past_removed(self, offsets: dict, say: bool = False) -> dict:
        """``past_removed`` over the brokers read by partition: positions deleted that held none of the
        query's topics are not loss."""
        listed = {broker: logs for broker, logs in self._listings.items() if self._by_partition.get(broker)}
        return past_removed(offsets, listed, self._removed_topics, self.options.fail_on_data_loss, say)

    def _removed_topics(self, broker: str, partition: int, since: int) -> RemovedTopics:
        client = self._client(broker)
        return removed_topics(self._fetch[broker], client, partition, since, self.options.topics)

    def _client(self, broker: str) -> OffsetsClient:
        client = self._clients.get(broker)
        if client is None:
            client = self._clients[broker] = self._fetch[broker].client()
        return client

    def _list_all(
        self, brokers: list[str] | None = None
    ) -> tuple[Listings, dict[str, BrokerUnreachableError]]:
        """List brokers concurrently (one broker's retries must not delay the others) and cache the result.

        A broker found down is then tried once per call, without retries, until it answers again: a dead
        broker delays one batch by its retries, not every batch.
        """
        if self.options.reads_cluster:
            return self._list_cluster()
        wanted = list(self._fetch) if brokers is None else brokers
        clients = {
            broker: self._probe(broker) if broker in self._down else self._client(broker) for broker in wanted
        }
        with ThreadPoolExecutor(max_workers=min(8, len(wanted)) or 1) as pool:
            futures = {
                broker: pool.submit(self._list_broker, broker, client) for broker, client in clients.items()
            }
        listings: Listings = {}
        down: dict[str, BrokerUnreachableError] = {}
        for broker, future in futures.items():
            try:
                listings[broker] = future.result()
                self._down.discard(broker)
            except BrokerUnreachableError as error:
                down[broker] = error
                self._down.add(broker)
        self._check_one_name_per_store()
        self._listings.update(listings)
        return listings, down

    def _check_one_name_per_store(self) -> None:
        """Two ids of ``brokers`` answering with one store are one broker named twice (a URL pasted twice,
        or spelt two ways): each record would be read once per id, under ids no sink tells apart."""
        named: dict[str, list[str]] = {}
        for broker, store in self._stores.items():
            if store is not None:
                named.setdefault(store, []).append(broker)
        for store, brokers in named.items():
            if len(brokers) > 1:
                urls = ", ".join(f"{broker!r} ({self._fetch[broker].url})" for broker in sorted(brokers))
                raise SourceOptionError(
                    "brokers",
                    f"{urls} serve the same store {store}: one broker named twice, whose every record "
                    "would be read once per name. Name each broker once",
                )

    def _list_cluster(self) -> tuple[Listings, dict[str, BrokerUnreachableError]]:
        """The cluster's topics as one "broker" keyed by the cluster's name (and the routes, cached)."""
        name = self.options.cluster_name
        if self._lister is None:
            self._lister = ClusterLister(name, self.options.bootstrap_servers, self._fetch[name])
        try:
            self._cluster = self._lister.list(self.options.log_patterns)
        except BrokerUnreachableError as error:
            return {}, {name: error}
        listings: Listings = {name: {topic: route.extent for topic, route in self._cluster[1].items()}}
        self._listings.update(listings)
        return listings, {}

    def _stores_of(self, listings: Listings) -> dict[str, str | None]:
        """The store identities of the standalone brokers of ``listings`` (none for a cluster)."""
        if self.options.reads_cluster:
            return {}
        return {broker: self._stores.get(broker) for broker in listings}

    def _listed(self, listings: Listings, target: dict[str, dict[str, int]] | None = None) -> list[str]:
        """The brokers of ``listings`` whose offsets name the filters they were listed with: standalone
        brokers read by topic and a cluster every member listed, not a hub's (``listed_filters``), planned in
        this batch (``target``)."""
        if self.options.sites:
            return []
        if self.options.reads_cluster:  # only when every member listed: a topic no replica listed is missed
            complete = self._lister is not None and self._lister.complete
            name = self.options.cluster_name
            return [name] if complete and name in listings and (target is None or name in target) else []
        return [
            broker
            for broker in listings
            if not self._by_partition.get(broker) and (target is None or broker in target)
        ]

    def _probe(self, broker: str) -> OffsetsClient:
        return replace(self._fetch[broker], retries=0).client()

    def _note_how_read(self, offsets: dict) -> None:
        """Brokers whose offsets are checkpointed keep being read as they were (by partition or topic)."""
        for broker, keys in offsets.items():
            by_partition = reads_partitions(keys)
            if by_partition is not None:
                self._by_partition[broker] = by_partition

    def _list_broker(self, broker: str, client: OffsetsClient) -> dict[str, LogExtent]:
        """A broker's partitions (read by partition) or its logs matching the topics (read by topic); an error
        answer (a refused token aside) as a ``BrokerAnswerError`` naming the broker."""
        try:
            return self._listing_of(broker, client)
        except OffsetsApiError as error:
            raise BrokerAnswerError(broker, self._fetch[broker].url, error) from error
        finally:
            if client is not self._clients.get(broker):
                client.close()

    def _listing_of(self, broker: str, client: OffsetsClient) -> dict[str, LogExtent]:
        extents = self._list_partitions(broker, client)
        if extents is not None:
            return extents
        fetch = self._fetch[broker]
        logs: dict[str, LogExtent] = {}
        stores: set[str | None] = set()
        sent, keep = listing(self.options.log_patterns)  # (thousands of named topics: a cover)
        for pattern in sent:
            for info in fetch.call(partial(client.list_logs, pattern)):
                if keep is None or keep(info.topic):
                    logs[info.topic] = LogExtent(info.start_offset, info.end_offset)
            stores.add(client.store)
        if len(stores) > 1:  # replaced between two patterns' listings: listed again next batch
            changed = RuntimeError("its store changed while listed")
            raise BrokerUnreachableError(broker, fetch.url, 0.0, changed)
        self._stores[broker] = client.store
        return logs

    def _say_if_nothing_matches(self, listings: Listings) -> None:
        """Once a run, when brokers answered: a warning if option ``topics`` matches no log they hold
        (``unmatched_topics``)."""
        if self._matches_looked_for or not self.options.topics or not listings:
            return
        self._matches_looked_for = True
        ways = {
            broker: BrokerWay(bool(self._by_partition.get(broker)), self._fetch[broker], self._client(broker))
            for broker in listings
        }
        say_if_nothing_matches(self.options.topics, self.options.log_patterns, listings, ways)

    def _list_partitions(self, broker: str, client: OffsetsClient) -> dict[str, LogExtent] | None:
        """The broker's partitions when it is read by partition, else None (it is read by topic).

        A broker not decided yet is read by partition when the options allow it and it serves partition
        reads (an older broker, or a cluster's member, answers 404)."""
        by_partition = self._by_partition.get(broker)
        if by_partition is None:
            options = self.options
            by_partition = (
                options.read_by == "partitions"
                and not options.sites  # a hub's sites are told apart by topic name
                and not options.reads_cluster
                and options.starting_offsets.kind is not StartKind.SPECIFIC
            )
        if not by_partition:
            self._by_partition[broker] = False
            return None
        try:
            extents = self._fetch[broker].call(client.partitions)
        except (OffsetsApiError, BrokerAuthError) as refused:
            # 403: a token limited to topic filters reads by topic (a refused token is raised as it is)
            error = refused.__cause__ if isinstance(refused, BrokerAuthError) else refused
            if not isinstance(error, OffsetsApiError) or error.status not in (403, 404):
                raise
            if self._by_partition.get(broker):
                raise RuntimeError(
                    f"timestone source: the checkpoint reads broker {broker!r} by storage partition, but "
                    "it no longer serves partition reads to this query (a cluster's member, an older broker, "
                    "or a token limited to topic filters): start the query again with a new checkpoint"
                ) from error
            self._by_partition[broker] = False
            return None
        self._by_partition[broker] = True
        self._stores[broker] = client.store
        return {
            position_key(extent.partition): LogExtent(extent.start_position, extent.end_position)
            for extent in extents
        }

    def _offsets_for_timestamp(self, listings: Listings, timestamp_ms: int) -> dict[str, dict[str, int]]:
        """Each listed log's offset (or partition's position) for the time. A request each, so they are
        asked _TIME_ASKERS at a time, each asker with its own connections: 50,000 device topics asked one
        after another took 50,000 round trips."""
        keys = [(broker, topic) for broker, logs in listings.items() for topic in logs]

        def resolve(share: list[tuple[str, str]]) -> list[tuple[str, str, int]]:
            clients: dict[str, OffsetsClient] = {}
            try:
                return [(b, t, self._offset_for_timestamp(b, t, timestamp_ms, clients)) for b, t in share]
            finally:
                for client in clients.values():
                    client.close()

        resolved: dict[str, dict[str, int]] = {broker: {} for broker in listings}
        shares = [keys[number::_TIME_ASKERS] for number in range(_TIME_ASKERS)]
        with ThreadPoolExecutor(max_workers=_TIME_ASKERS) as pool:
            for answers in pool.map(resolve, [share for share in shares if share]):
                for broker, topic, offset in answers:
                    resolved[broker][topic] = offset
        return resolved

    def _offset_for_timestamp(
        self, broker: str, topic: str, timestamp_ms: int, clients: dict[str, OffsetsClient]
    ) -> int:
        """The broker's offset for the time (0 for a log deleted since listed: then its listed start), asked
        through ``clients`` (one per broker or member, made when first needed).

        Reading a cluster, the member the topic was listed from answers (offsets are the same on all)."""
        fetch = self._fetch[broker]
        node = broker
        if self._cluster is not None and not is_partition_key(topic):
            layout, routes = self._cluster
            node = routes[topic].readers[0]
            fetch = replace(fetch, broker=node, url=layout.offsets_api(node))
        client = clients.get(node) or clients.setdefault(node, fetch.client())
        if is_partition_key(topic):
            return fetch.call(lambda: client.position_for_timestamp(partition_of(topic), timestamp_ms))
        try:
            return fetch.call(lambda: client.offset_for_timestamp(topic, timestamp_ms))
        except UnknownTopicError:
            return 0


def _marks(start: dict[str, int], end: dict[str, int]) -> dict[int, int]:
    """A broker's query-start marks for a batch: its start's, or for its first batch its end's."""
    return marks_of(start) if holds_positions(start) else first_batch_marks(end)


def _without_filters(keys: dict[str, int]) -> dict[str, int]:
    return {key: value for key, value in keys.items() if not key.startswith(FILTER_PREFIX)}


def _ends(listings: Listings) -> dict[str, dict[str, int]]:
    return {broker: {key: extent.end for key, extent in logs.items()} for broker, logs in listings.items()}


_TIME_ASKERS = 8
"""Requests for a start time's offsets in flight at once (``_offsets_for_timestamp``)."""

_NAMED = 20
"""Logs a warning names at most (thousands of a fleet's device topics make one line unreadable)."""


def _restarted(restart: RestartedLog) -> str:
    held = f"[{restart.start}, {restart.end})" if restart.start is not None else f"up to {restart.end}"
    return f"{restart.broker} {describe(restart.topic)} next {restart.expected}, the log now holds {held}"


def _warn_lost(plan: BatchPlan) -> None:
    if plan.restarted:
        log.warning(
            "timestone source: reading %d logs again from their start, each ending below the offset to read "
            "next (the checkpoint's; startingOffsets' if new): recreated, or their broker's store replaced; "
            "what they held past their new end is lost, not counted (failOnDataLoss=false): %s",
            len(plan.restarted),
            ", ".join(map(_restarted, plan.restarted[:_NAMED]))
            + (f" and {len(plan.restarted) - _NAMED} more" if len(plan.restarted) > _NAMED else ""),
        )
    records = [gap for gap in plan.lost if not is_partition_key(gap.topic)]
    positions = [gap for gap in plan.lost if is_partition_key(gap.topic)]
    if records:
        log.warning(
            "timestone source: skipping %d records lost to retention (failOnDataLoss=false): %s",
            sum(gap.records for gap in records),
            ", ".join(f"{gap.broker} {describe(gap.topic)} [{gap.start}, {gap.end})" for gap in records),
        )
    if positions:
        log.warning(
            "timestone source: skipping %d positions (failOnDataLoss=false), %s: %s",
            sum(gap.records for gap in positions),
            REMOVED_POSITIONS,
            ", ".join(f"{gap.broker} {describe(gap.topic)} [{gap.start}, {gap.end})" for gap in positions),
        )
