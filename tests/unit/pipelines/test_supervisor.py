"""The supervisor's decisions: which failures it restarts and after what wait, which it names and gives up on.

The queries here are stand-ins holding what the supervisor reads of a Spark ``StreamingQuery`` (whether it is
active, the exception it ended with); the clock is the test's. Real queries failing in real jobs are the
end-to-end tests' (``tests/e2e/telemetry/test_telemetry_supervised.py``,
``tests/e2e/ota/test_actions_supervised.py``).
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from broker_edge.config.loader import ConfigError
from pipelines.metrics import PipelineMetrics
from pipelines.supervisor import NOT_RESTARTABLE, GaveUp, RestartConfig, Supervisor, error_name, unrecoverable

WORKER_LOST = (
    "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch "
    "sink. "
    "Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 164.0 "
    "failed 1 times, most recent failure: java.io.IOException: Stream closed"
)
DATA_LOSS = (
    "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform "
    "latestOffset: Traceback (most recent call last):\n  ...\nsources.errors.DataLossError: "
    "timestone source: data loss on edge1 devices/d1/telemetry: offsets 0-99 were deleted by retention"
)


class StandInQuery:
    """What the supervisor reads of a streaming query."""

    def __init__(self) -> None:
        self.isActive = True
        self.error: str | None = None
        self.stopped = False
        self.lastProgress = None  # no batch has run (the metrics' counting is the end-to-end tests')

    def exception(self) -> Exception | None:
        return RuntimeError(self.error) if self.error is not None else None

    def fail(self, error: str) -> None:
        self.error, self.isActive = error, False

    def stop(self) -> None:
        self.stopped, self.isActive = True, False


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def supervised(config: RestartConfig | None = None) -> tuple[Supervisor, list[StandInQuery], Clock]:
    clock = Clock()
    started: list[StandInQuery] = []

    def start() -> Any:
        started.append(StandInQuery())
        return started[-1]

    supervisor = Supervisor("telemetry", config or RestartConfig(), PipelineMetrics(), clock=clock)
    supervisor.add("telemetry", cast(Any, start))
    return supervisor, started, clock


def test_a_lost_worker_is_restarted_after_a_wait_that_doubles_and_is_counted():
    supervisor, started, clock = supervised(RestartConfig(initial_backoff_s=1.0, max_backoff_s=3.0))
    waits: list[float] = []
    for _ in range(4):
        failed_at = clock.now
        started[-1].fail(WORKER_LOST)
        supervisor.check()
        while len(started) == len(waits) + 1:  # not restarted yet
            clock.now += 0.25
            supervisor.check()
        waits.append(clock.now - failed_at)
    assert waits == [1.0, 2.0, 3.0, 3.0]  # doubling, up to max_backoff_s
    assert supervisor.metrics.restarts("telemetry", "telemetry") == 4
    assert supervisor.gave_up is None and supervisor.running() == [started[-1]]


def test_a_query_that_ran_long_enough_waits_the_first_wait_again():
    supervisor, started, clock = supervised(RestartConfig(initial_backoff_s=1.0, healthy_after_s=60.0))
    for _ in range(3):
        started[-1].fail(WORKER_LOST)
        supervisor.check()
        clock.now += 10
        supervisor.check()
    clock.now += 120  # healthy since its last start
    started[-1].fail(WORKER_LOST)
    supervisor.check()
    clock.now += 1.0
    supervisor.check()
    assert len(started) == 5


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (DATA_LOSS, "data loss (failOnDataLoss)"),
        ("ConfigError: tables.root: not writable", "bad configuration"),
        ("sources.options.SourceOptionError: timestone source option 'fetchRetries'", "bad source option"),
        ("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column ... cannot be resolved", "query does not analyse"),
    ],
)
def test_what_a_restart_cannot_fix_stops_the_job_naming_it(error, reason):
    supervisor, started, clock = supervised()
    started[-1].fail(error)
    assert supervisor.run(poll_s=0.01) == NOT_RESTARTABLE
    gave_up = supervisor.gave_up
    assert gave_up is not None and (gave_up.query, gave_up.reason) == ("telemetry", reason)
    clock.now += 3600
    supervisor.check()
    assert len(started) == 1 and supervisor.metrics.restarts("telemetry") == 0


def test_restarts_turned_off_stop_the_job_at_the_first_failure():
    supervisor, started, _ = supervised(RestartConfig(enabled=False))
    started[-1].fail(WORKER_LOST)
    gave_up = supervisor.check()
    assert gave_up is not None and "restart.enabled: false" in gave_up.reason and gave_up.exit_status == 1


def test_a_query_stopped_or_finished_is_not_restarted():
    supervisor, started, clock = supervised()
    started[-1].stop()
    assert supervisor.run(poll_s=0.01) == 0
    clock.now += 3600
    supervisor.check()
    assert len(started) == 1 and supervisor.gave_up is None


def test_the_failure_is_named_by_its_innermost_error_and_transient_ones_are_restarted():
    assert error_name(WORKER_LOST) == "IOException"
    assert error_name("py4j.protocol.Py4JJavaError: An error occurred") == "error"
    assert unrecoverable(WORKER_LOST) is None
    assert unrecoverable("BrokerUnreachableError: edge1 did not answer") is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("initial_backoff_s", 0.0),
        ("max_backoff_s", 0.5),
        ("healthy_after_s", -1.0),
        ("max_restarts", -1),
        ("restart_window_s", 0.0),
    ],
)
def test_restart_settings_are_checked(key, value):
    with pytest.raises(ConfigError, match=key):
        RestartConfig(**{key: value})


def test_a_run_that_must_end_gives_up_after_failures_in_a_row_naming_them():
    """``--available-now``: a batch that fails on every replay stops the run (exit status 1) after
    ``give_up_after`` restarts instead of keeping it going for ever; a run without it keeps restarting."""
    supervisor, started, clock = supervised(RestartConfig(initial_backoff_s=1.0, max_backoff_s=1.0))
    supervisor.give_up_after = 2
    for _ in range(3):
        started[-1].fail(WORKER_LOST)
        gave_up = supervisor.check()
        clock.now += 1.0
        supervisor.check()
    assert gave_up is not None and gave_up.reason == "failed 3 times in a row, the last 2 after a restart"
    assert len(started) == 3 and supervisor.metrics.restarts("telemetry", "telemetry") == 2
    endless, started, clock = supervised(RestartConfig(initial_backoff_s=1.0, max_backoff_s=1.0))
    for _ in range(10):
        started[-1].fail(WORKER_LOST)
        assert endless.check() is None
        clock.now += 1.0
        endless.check()
    assert len(started) == 11


#: The source refusing offsets no source wrote (a hand-edited offsets file of the checkpoint), as it reaches
#: the driver.
OFFSETS_EDITED = (
    "[STREAM_FAILED] Query [id = 53ee71e0] terminated with exception: [PYTHON_STREAMING_DATA_SOURCE_RUNTIME_"
    "ERROR] Failed when Python streaming data source perform latestOffset: Traceback (most recent call last):"
    "\nValueError: timestone source: the checkpoint's offsets of broker 'edge1' hold '#p0': -5, not an "
    "offset (a whole number >= 0). Was the offset log (offsets/ in the checkpoint location) edited? Write "
    "them back as the source wrote them, or start the query on a new checkpoint\n SQLSTATE: 38000"
)


def test_a_checkpoint_whose_offsets_were_edited_is_not_restarted():
    """The checkpoint is the same at every restart, so a query whose offsets the source refuses as no
    source wrote them failed again on each (a continuous job restarted it for ever, a WARNING a minute);
    the job gives up at once, naming the reason."""
    supervisor, started, clock = supervised()
    started[-1].fail(OFFSETS_EDITED)
    gave_up = supervisor.check()
    clock.now += 3600
    supervisor.check()
    assert gave_up is not None and gave_up.reason == "checkpoint's offsets edited by hand"
    assert len(started) == 1 and supervisor.metrics.restarts("telemetry") == 0


def test_a_broker_whose_store_was_replaced_is_data_loss_not_restarted():
    """A broker whose data directory was wiped serves a new store: under failOnDataLoss the source refuses it
    at every start (what the old one held past the checkpoint is gone), and a continuous job restarted the
    query for ever; the job gives up at once, as on any data loss."""
    replaced = (
        "Traceback (most recent call last):\nsources.broker_stores.StoreReplacedError: timestone source: "
        "broker 'edge1' now serves store 9f2c, not store a7dc that the checkpoint's offsets were taken from: "
        "its data directory was wiped or replaced, and its logs started again at offset 0."
    )
    supervisor, started, _ = supervised()
    started[-1].fail(replaced)
    gave_up = supervisor.check()
    assert gave_up is not None and gave_up.reason == "broker's store replaced: data loss (failOnDataLoss)"
    assert len(started) == 1


def fail_at(
    supervisor: Supervisor, started: list[StandInQuery], clock: Clock, errors: list[str], every_s: float
) -> GaveUp | None:
    """Fail the running query with each of ``errors`` in turn, ``every_s`` seconds apart (each restart
    waited out); the supervisor's answer to the last."""
    gave_up = None
    for error in errors:
        started[-1].fail(error)
        gave_up = supervisor.check()
        if gave_up is not None:
            return gave_up
        clock.now += every_s
        supervisor.check()
    return gave_up


BROKER_GONE = "sources.errors.BrokerUnreachableError: edge1 did not answer"
STAGE_FAILED = "org.apache.spark.SparkException: Job aborted: Task 0 in stage {}.0 failed: ValueError: no row"


def test_a_query_failing_the_same_way_max_restarts_times_within_the_window_stops_the_job():
    """A continuous job restarted a query that failed the same way every time for ever (a WARNING a minute,
    the job never exiting), so neither systemd nor a Databricks job saw a failure to alert on. After
    ``max_restarts`` restarts for one failure within ``restart_window_s`` it gives up, exit status 1, the
    reason naming the count; numbers in the error (a stage, a batch) do not make a failure another."""
    config = RestartConfig(initial_backoff_s=1.0, max_backoff_s=1.0, max_restarts=3, restart_window_s=60.0)
    supervisor, started, clock = supervised(config)
    gave_up = fail_at(supervisor, started, clock, [STAGE_FAILED.format(n) for n in range(10)], every_s=5.0)
    assert gave_up is not None
    assert gave_up.reason == "failed the same way 4 times in 15 s (restart.max_restarts: 3)"
    assert gave_up.exit_status == 1  # a new process may get past it: a service restarts the job
    assert len(started) == 4 and supervisor.metrics.restarts("telemetry", "telemetry") == 3


def test_failures_that_differ_or_are_spaced_beyond_the_window_keep_being_restarted():
    config = RestartConfig(initial_backoff_s=1.0, max_backoff_s=1.0, max_restarts=3, restart_window_s=60.0)
    supervisor, started, clock = supervised(config)
    assert fail_at(supervisor, started, clock, [WORKER_LOST, BROKER_GONE] * 5, 5.0) is None
    assert len(started) == 11
    spaced, started, clock = supervised(config)
    assert fail_at(spaced, started, clock, [WORKER_LOST] * 10, every_s=30.0) is None  # 3 in any 60 s
    assert len(started) == 11
    endless, started, clock = supervised(RestartConfig(max_restarts=0, max_backoff_s=1.0))
    assert fail_at(endless, started, clock, [WORKER_LOST] * 30, every_s=1.0) is None  # 0: for ever
    assert len(started) == 31
