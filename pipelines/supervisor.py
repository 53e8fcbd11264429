"""Streaming queries that restart themselves: a failed query starts again from its checkpoint, with backoff.

A query of either job may fail for reasons a second attempt does not meet: a Python worker that missed
Spark's fixed wait on an overloaded machine, a broker that was restarting, a commit that lost too many
races. Every write of both jobs is idempotent per (query, batch) and Spark replays the failed batch with
the same offsets, so starting the query again from its checkpoint loses and duplicates nothing. The
:class:`Supervisor` does that for each query it watches: it logs why the query failed, counts the restart
in ``timestone_pipeline_query_restarts_total``, waits (1 s, doubling up to a minute, back to 1 s once a
query has run a while) and starts it again.

It gives up only on failures a restart cannot fix (:func:`unrecoverable`): bad configuration (a source
option, a config value, a table whose schema or features do not match, a query that does not analyse, a
token the broker refuses), data loss under ``failOnDataLoss`` and checkpoint offsets the source refuses as
edited by hand. The job then stops with exit status :data:`NOT_RESTARTABLE` (5), naming the reason, rather
than failing the same way forever; a service manager does not start it again either (systemd:
``RestartPreventExitStatus``). It also gives up on a query that failed the same way
(:func:`failure_signature`) more than ``max_restarts`` times in a row within ``restart_window_s``, so that a
service manager sees the job fail; a different failure, or one past the window, is restarted. A run that
must end (``--available-now``) also gives up on a query that keeps failing (``give_up_after`` failures in a
row). Those two, and a failure with restarts turned off, exit 1: a new process (a fresh JVM and Python
workers, a broker back by then) may well get past them, so a service manager may start the job again.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker_edge.config.loader import ConfigError

from .metrics import PipelineMetrics
from .pipeline_logs import failure_summary

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

FAILED = 1
"""Exit status of a job that gave up on failures a new process may get past (restarts used up or off)."""
NOT_RESTARTABLE = 5
"""Exit status of a job that stopped on a failure no restart fixes (:func:`unrecoverable`): starting it
again fails the same way, so its service is not restarted (conf/systemd/timestone-pipeline@.service)."""

#: What in a failed query's error says a restart cannot fix it, and how the job names the reason. Errors
#: reach the driver as text (a Python traceback inside a Spark error), hence names, not types.
UNRECOVERABLE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bDataLossError\b|timestone source: data loss"), "data loss (failOnDataLoss)"),
    (re.compile(r"timestone source: the checkpoint's offsets of "), "checkpoint's offsets edited by hand"),
    (re.compile(r"\bStoreReplacedError\b"), "broker's store replaced: data loss (failOnDataLoss)"),
    (re.compile(r"\bSourceOptionError\b|timestone source option '"), "bad source option"),
    (re.compile(r"\bConfigError\b"), "bad configuration"),
    (re.compile(r"\bSchemaMismatch\b"), "table schema does not match its declaration"),
    (re.compile(r"\bTableStoreError\b"), "table unusable by this store"),
    (re.compile(r"\bBrokerAuthError\b|refused the token"), "broker refused the token"),
    (re.compile(r"\bAnalysisException\b|\[UNRESOLVED_COLUMN|\[DATATYPE_MISMATCH"), "query does not analyse"),
)

#: An exception named as a traceback's last line or a Java stack trace's first one names it: ``Name: why``.
_ERROR_NAME = re.compile(r"\b([A-Z][A-Za-z0-9]*(?:Error|Exception)): ")
#: Exceptions that only carry another (a Python error inside a Spark one): never the name of a failure.
_WRAPPERS = frozenset({"StreamingQueryException", "PythonException", "SparkException", "Py4JJavaError"})
#: What differs between two failures of one cause: numbers (a stage, a batch, an offset) and hex ids.
_VARYING = re.compile(r"\b(?=[0-9a-f-]*[0-9])[0-9a-f]+(?:-[0-9a-f]+)*\b|\d+")


def unrecoverable(error: str) -> str | None:
    """Why a query that failed with ``error`` (its text) cannot be fixed by a restart; None if it can."""
    for pattern, reason in UNRECOVERABLE:
        if pattern.search(error):
            return reason
    return None


def unrecoverable_failure(failure: BaseException) -> str | None:
    """Why ``failure``, raised as a query starts (a table that does not match its declaration, a query that
    does not analyse), is one no restart fixes; None if a restart may."""
    return unrecoverable(f"{type(failure).__name__}: {failure}\n{failure_summary(failure)}")


def failure_signature(failure: BaseException) -> str:
    """What makes two failures of a query the same: its one-line summary, numbers and ids masked."""
    return _VARYING.sub("#", failure_summary(failure))


def _ran(progress: Any) -> bool:
    """Whether a progress report is of a micro-batch that ran (an idle trigger's has no ``addBatch``)."""
    return "addBatch" in progress["durationMs"]


def error_name(error: str) -> str:
    """The first exception in ``error`` that is not a wrapper of another (the metric's ``error`` label)."""
    names = [name for name in _ERROR_NAME.findall(error) if name not in _WRAPPERS]
    return names[0] if names else "error"


@dataclass
class RestartConfig:
    """How a job restarts its failed queries (``stream.restart`` / ``restart`` in the job's config)."""

    enabled: bool = True
    """False: a failed query stops the job (exit status 1, 5 for what no restart fixes), as a batch job's
    would."""
    initial_backoff_s: float = 1.0
    """Wait before the first restart; it doubles with each failure that follows, up to ``max_backoff_s``."""
    max_backoff_s: float = 60.0
    healthy_after_s: float = 300.0
    """A query that has run this long since it (re)started waits ``initial_backoff_s`` again."""
    max_restarts: int = 20
    """Restarts for one failure: a query that fails the same way once more within ``restart_window_s``
    stops the job (exit status 1); 0: restarted for ever."""
    restart_window_s: float = 3600.0
    """The seconds within which ``max_restarts`` + 1 failures alike stop the job (older ones forgotten)."""

    def __post_init__(self) -> None:
        for name in ("initial_backoff_s", "max_backoff_s", "healthy_after_s", "restart_window_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, "must be positive")
        if self.max_restarts < 0:
            raise ConfigError("max_restarts", "must be 0 (for ever) or more")
        if self.max_backoff_s < self.initial_backoff_s:
            raise ConfigError("max_backoff_s", "must be at least initial_backoff_s")


@dataclass
class SupervisedQuery:
    """One query the supervisor keeps running: how to start it, and what to do once it has ended."""

    name: str
    start: Callable[[], StreamingQuery]
    #: called with the query each time it has ended (failed, stopped or finished), before any restart
    ended: Callable[[StreamingQuery], None] = lambda query: None
    query: StreamingQuery | None = None
    started_at: float = 0.0
    failures: int = 0  # consecutive failures, for the backoff
    same_failures: list[float] = field(default_factory=list)
    """When the query failed the same way (``signature``) in a row, within the restart window."""
    signature: str | None = None
    restart_at: float | None = None
    done: bool = False
    counted_batch: int = -1
    """The last micro-batch id counted in the metrics (ids go on from the checkpoint across restarts)."""


@dataclass(frozen=True)
class GaveUp:
    """A query failed in a way a restart cannot fix."""

    query: str
    reason: str
    error: str
    restartable: bool = False
    """Whether a new process may get past it (restarts used up or off), not a failure no restart fixes."""

    @property
    def exit_status(self) -> int:
        """The job's exit status: :data:`FAILED` when restartable, else :data:`NOT_RESTARTABLE`."""
        return FAILED if self.restartable else NOT_RESTARTABLE


@dataclass
class Supervisor:
    """Watches a job's queries and restarts those that fail (see the module docstring).

    ``clock`` and ``sleep`` are monotonic seconds and a pause (tests pass fast ones).
    """

    pipeline: str
    config: RestartConfig = field(default_factory=RestartConfig)
    metrics: PipelineMetrics = field(default_factory=PipelineMetrics)
    clock: Callable[[], float] = time.monotonic
    queries: list[SupervisedQuery] = field(default_factory=list)
    gave_up: GaveUp | None = None
    give_up_after: int | None = None
    """Failures in a row after which a query is not restarted (the job stops, exit status 1); None: never.
    A run that must end (``--available-now``) sets it: a batch that fails the same way on every replay (a
    value no restart changes) would otherwise keep it going for ever."""
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)

    def add(
        self,
        name: str,
        start: Callable[[], StreamingQuery],
        ended: Callable[[StreamingQuery], None] | None = None,
    ) -> SupervisedQuery:
        """Start the query now and watch it from then on."""
        watched = SupervisedQuery(name, start, ended or (lambda query: None))
        self._start(watched)
        self.queries.append(watched)
        return watched

    def check(self) -> GaveUp | None:
        """One look at every query: note those that ended, restart those whose wait is over."""
        now = self.clock()
        for watched in self.queries:
            query = watched.query
            if watched.done:
                continue
            if query is not None:
                try:
                    self._count_batches(watched, query)
                except Exception:  # the metrics never stop the job
                    log.debug("%s query %s: progress not counted", self.pipeline, watched.name, exc_info=True)
            if query is not None and not query.isActive:
                self._ended(watched, query, now)
                if self.gave_up is not None:
                    return self.gave_up
            if watched.restart_at is not None and now >= watched.restart_at:
                self._start(watched)
        return None

    def run(self, poll_s: float = 0.5) -> int:
        """Watch until every query has ended on its own (0), one failed for good (its
        :attr:`GaveUp.exit_status`) or :meth:`stop`."""
        while not self._stop.is_set():
            if (gave_up := self.check()) is not None:
                return gave_up.exit_status
            if all(watched.done for watched in self.queries):
                return 0
            self._stop.wait(poll_s)
        return 0

    def stop(self) -> None:
        """End :meth:`run`; the caller stops the queries."""
        self._stop.set()

    def running(self) -> list[StreamingQuery]:
        """The queries running now."""
        return [w.query for w in self.queries if w.query is not None and w.query.isActive]

    def _count_batches(self, watched: SupervisedQuery, query: StreamingQuery) -> None:
        """Count in the metrics the micro-batches the query completed since the last look: its last
        progress report, or its recent ones when several batches ended in between or an idle trigger's
        report came after them. An idle trigger's report (without ``addBatch``) names the next batch, which
        has not run: not a batch, but every batch before it has ended."""
        last = query.lastProgress
        if last is None:
            return
        ran_last = _ran(last)
        newest = last["batchId"] if ran_last else last["batchId"] - 1
        if newest <= watched.counted_batch:
            return
        reports = [last] if ran_last and newest == watched.counted_batch + 1 else query.recentProgress
        ran = {p["batchId"]: p for p in reports if _ran(p) and watched.counted_batch < p["batchId"] <= newest}
        for batch_id in sorted(ran):
            self.metrics.batch_completed(self.pipeline, watched.name, ran[batch_id])
        watched.counted_batch = newest  # (a batch gone from the recent reports is not counted: not twice)

    def _start(self, watched: SupervisedQuery) -> None:
        watched.restart_at = None
        watched.query = watched.start()
        watched.started_at = self.clock()
        self.metrics.query_up.labels(self.pipeline, watched.name).set(1)

    def _ended(self, watched: SupervisedQuery, query: StreamingQuery, now: float) -> None:
        self.metrics.query_up.labels(self.pipeline, watched.name).set(0)
        watched.query = None
        failure = query.exception()
        try:
            watched.ended(query)
        except Exception:  # cleaning up after a query must not stop the others
            log.exception("%s query %s: cleaning up after it ended failed", self.pipeline, watched.name)
        if failure is None:  # stopped, or an availableNow query that read everything
            watched.done = True
            return
        error = str(failure)
        if now - watched.started_at >= self.config.healthy_after_s:
            watched.failures = 0
        reason = unrecoverable(error)
        restartable = reason is None
        if reason is None and self.give_up_after is not None and watched.failures >= self.give_up_after:
            reason = (
                f"failed {watched.failures + 1} times in a row, the last {self.give_up_after} after a restart"
            )
        if reason is None:
            reason = self._same_again(watched, failure, now)
        if reason is not None or not self.config.enabled:
            reason = reason or "restarts are off (restart.enabled: false)"
            log.debug("%s query %s failed", self.pipeline, watched.name, exc_info=failure)
            log.error(
                "%s query %s failed, not restarted: %s: %s",
                self.pipeline,
                watched.name,
                reason,
                failure_summary(failure),
            )
            self.gave_up = GaveUp(watched.name, reason, error, restartable)
            watched.done = True
            return
        delay = min(self.config.max_backoff_s, self.config.initial_backoff_s * 2**watched.failures)
        watched.failures += 1
        watched.restart_at = now + delay
        self.metrics.query_restarts.labels(self.pipeline, watched.name, error_name(error)).inc()
        log.warning(
            "%s query %s failed (%s); restarting it from its checkpoint in %.1f s (restart %d in a row): %s",
            self.pipeline,
            watched.name,
            error_name(error),
            delay,
            watched.failures,
            failure_summary(failure),
        )
        log.debug("%s query %s failed", self.pipeline, watched.name, exc_info=failure)

    def _same_again(self, watched: SupervisedQuery, failure: BaseException, now: float) -> str | None:
        """Note the failure; why the query is given up when it failed this way more than ``max_restarts``
        times in a row within ``restart_window_s``, else None."""
        signature = failure_signature(failure)
        if signature != watched.signature:
            watched.signature, watched.same_failures = signature, []
        window = self.config.restart_window_s
        watched.same_failures = [t for t in watched.same_failures if now - t <= window] + [now]
        most = self.config.max_restarts
        if most == 0 or len(watched.same_failures) <= most:
            return None
        times, took = len(watched.same_failures), now - watched.same_failures[0]
        return f"failed the same way {times} times in {took:.0f} s (restart.max_restarts: {most})"
