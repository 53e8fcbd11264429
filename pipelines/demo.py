"""``timestone demo``: the whole platform on one machine, on embedded defaults, in about two minutes.

It starts an edge broker (a child process), a simulated fleet, the telemetry pipeline and the actions job on
a local Spark session; waits until the telemetry pipeline has registered the devices; writes one OTA action
row for the ``canary`` group; shows the rollout as a live bar; prints the outcome per state; and says where
the Delta tables and notebooks are. SIGTERM, SIGINT and a normal exit all stop the broker it started; so
does SIGKILL, which it cannot catch (the kernel tells the broker: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import logging
import math
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import pyarrow.compute as pc

from broker_edge.runtime.launcher import BrokerProcess
from pipelines.fleet.background import BackgroundFleet
from pipelines.fleet.cli import at_least_one, more_than_zero, probability
from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import FleetSpec
from pipelines.pipeline_logs import quiet_libraries
from pipelines.views.location import DEMO_WORKDIR, notebooks_hint

if TYPE_CHECKING:
    from pipelines.actions.operator import NewAction

STATES = ("queued", "in_progress", "succeeded", "failed", "rejected", "timed_out", "canceled")


def two_or_more(text: str) -> int:
    """``--devices``: dealt to the groups canary and fleet in turn; each group's rollout needs one."""
    count = at_least_one(text)
    if count < 2:
        raise argparse.ArgumentTypeError(
            f"expected 2 or more (a device in each of the demo's groups, canary and fleet), got {count}"
        )
    return count


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timestone demo",
        description="The whole platform on one machine, on embedded defaults, in about two minutes: an "
        "edge broker, simulated devices, the telemetry pipeline and the actions job on local Spark, "
        "Delta tables; a canary rollout, then a phased rollout of a bad build that its abort rule stops and "
        "rolls back.",
        epilog="exit status: 0 the demo ran to its end; 1 a step did not finish within --timeout (it says "
        "which), or a rollout did not end as planned (the canary completed; the bad build aborted by its "
        "rule and rolled back: a high --failure-rate can abort the canary); 2 a wrong "
        "command line; 3 optional dependencies missing",
    )
    parser.add_argument(
        "--devices", type=two_or_more, default=200, help="simulated devices, 2 or more (default 200)"
    )
    parser.add_argument(
        "--workdir", default=str(DEMO_WORKDIR), help=f"where the demo keeps its data (default {DEMO_WORKDIR})"
    )
    parser.add_argument(
        "--timeout", type=more_than_zero, default=240.0, help="give up after this many seconds (default 240)"
    )
    parser.add_argument(
        "--failure-rate",
        type=probability,
        default=0.05,
        help="share of devices whose OTA fails (default 0.05)",
    )
    parser.add_argument(
        "--reject-rate",
        type=probability,
        default=0.02,
        help="share of devices that reject OTA (default 0.02)",
    )
    return parser


class Progress:
    """One status line, redrawn in place on a terminal and printed now and then elsewhere."""

    def __init__(self, stream=sys.stdout) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._last = ""
        self._printed_at = 0.0

    def show(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
        elif text != self._last and time.monotonic() - self._printed_at > 2:
            print(text, file=self.stream, flush=True)
            self._printed_at = time.monotonic()
        self._last = text

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
        elif self._last:
            print(self._last, file=self.stream, flush=True)


class Children:
    """The processes the demo started, stopped on SIGTERM, SIGINT and at exit whatever the demo was doing.

    Without this a SIGTERM would end the demo at once and leave its broker running. The first signal raises
    ``SystemExit`` (status 128 + signal) so the demo unwinds: its queries stop between batches, then its
    broker (``demo_main``'s ``finally``), last, so that no running batch fails reading a broker already gone
    (each such batch printed Spark's and py4j's stack traces); a second one kills the children and leaves at
    once.
    """

    def __init__(self) -> None:
        self.brokers: list[BrokerProcess] = []
        self._signalled: int | None = None
        """The first signal taken (the demo is stopping), None before any."""

    def install(self) -> None:
        """Take SIGTERM and SIGINT (again after Spark, whose context takes SIGINT for itself)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    @property
    def stopping(self) -> bool:
        """Whether a signal told the demo to stop."""
        return self._signalled is not None

    def add(self, broker: BrokerProcess) -> BrokerProcess:
        self.brokers.append(broker)
        return broker

    def stop(self) -> None:
        for broker in reversed(self.brokers):
            broker.stop()

    def exit_if_signalled(self) -> None:
        """Raise the ``SystemExit`` of a signal taken before, again: the one the handler raised is lost when
        the signal lands in code that swallows what it raises (a finalizer, for one), and the demo went on
        as if never told to stop."""
        if self._signalled is not None:
            raise SystemExit(128 + self._signalled)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            for broker in self.brokers:
                broker.kill()
            os._exit(128 + signum)
        self._signalled = signum
        print(f"\n{signal.Signals(signum).name}: stopping the demo", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)


def bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else 0
    return "[" + "#" * filled + "-" * (width - filled) + f"] {done}/{total}"


def _wait(predicate, timeout_s: float, progress: Progress, describe, children: Children) -> bool:
    """Show ``describe()`` until ``predicate()`` holds (True) or ``timeout_s`` passed (False); a signal taken
    meanwhile whose ``SystemExit`` was swallowed stops the wait within one poll."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children.exit_if_signalled()
        if predicate():
            progress.show(describe())
            progress.done()
            return True
        progress.show(describe())
        time.sleep(0.5)
    progress.done()
    return False


def _state(store, action_id: str) -> dict:
    from pipelines.actions.operator import summaries

    rows = summaries(store, action_id)
    return rows[0] if rows else {}


def _describe(summary: dict) -> str:
    """One progress line of an action: its state, a bar of devices done, its phase and counts."""
    if not summary:
        return "  waiting for the fanout job ..."
    done = sum(summary[f"{state}_count"] for state in STATES[2:])
    phase = f"  phase {summary['phase']}" if summary.get("phase") is not None else ""
    return (
        f"  {summary['action_state']:<11} "
        + bar(done, summary["total_count"])
        + phase
        + f"  ok={summary['succeeded_count']} failed={summary['failed_count']}"
        + f" rejected={summary['rejected_count']}"
    )


def _follow(store, action_id: str, deadline: float, progress: Progress, children: Children) -> dict:
    """Show the action's progress until it has ended (or the demo's time is up); its final summary."""
    _wait(
        lambda: (
            _state(store, action_id).get("action_state", "IN_PROGRESS") not in ("IN_PROGRESS", "SCHEDULED")
        ),
        deadline - time.monotonic(),
        progress,
        lambda: _describe(_state(store, action_id)),
        children,
    )
    return _state(store, action_id)


BAD_BUILD = "2.1.0"
"""A version the demo's devices fail to install on a share of them (``version_failure_rates``)."""


FIRST_PHASE_MIN = 10
"""The fewest devices the bad build's first phase holds (all of a smaller fleet): the sample its abort rule
judges before any other device is sent it."""


def first_phase_size(in_fleet: int) -> int:
    """Devices in the bad build's first phase: 20 % of the fleet, at least ``FIRST_PHASE_MIN``."""
    return min(in_fleet, max(FIRST_PHASE_MIN, math.ceil(0.2 * in_fleet)))


def demo_behaviour(failure_rate: float, reject_rate: float) -> DeviceBehaviour:
    """How the demo's simulated devices act on an action (the bad build fails on 40 % of them)."""
    return DeviceBehaviour(
        telemetry_interval_s=2.0,
        download_delay_s=(1.0, 4.0),
        failure_rate=failure_rate,
        reject_rate=reject_rate,
        version_failure_rates={BAD_BUILD: 0.4},
    )


def bad_build_rollout(in_fleet: int) -> NewAction:
    """The demo's phased rollout of the bad build to group fleet (``in_fleet`` devices): a first phase of
    ``first_phase_size`` devices, which opens the next once half of them succeeded and every one of them
    finished (the abort rule's sample: ``min_executed``); one retry after a failure; abort once 10 % of the
    finished devices failed; roll back to 1.0.0."""
    from pipelines.actions.operator import NewAction

    first_phase = first_phase_size(in_fleet)
    return NewAction(
        group="fleet",
        version=BAD_BUILD,
        url=f"https://firmware.example.invalid/fw-{BAD_BUILD}.bin",
        sha256="7d1e" + "0" * 60,
        phases=[{"devices": first_phase, "success_pct": 50.0}, {"percent": 30.0, "wait_s": 5}, {}],
        abort_rules=[{"failure_kind": "failed", "threshold_pct": 10.0, "min_executed": first_phase}],
        retries=[{"failure_kind": "failed", "max_retries": 1, "backoff_s": 2}],
        rollback={
            "version": "1.0.0",
            "url": "https://firmware.example.invalid/fw-1.0.0.bin",
            "sha256": "0" * 64,
        },
        in_progress_timeout_s=60,
        created_by="demo",
    )


def _phased_bad_build(store, in_fleet: int, deadline: float, progress: Progress, children: Children) -> bool:
    """The bad build's phased rollout (``bad_build_rollout``), followed until it stops on its abort rule
    and rolls back: True when it did."""
    from pipelines.actions.operator import create_action

    first_phase = first_phase_size(in_fleet)
    action_id = create_action(store, bad_build_rollout(in_fleet))
    print(
        f"\nWrote OTA action {action_id} (firmware {BAD_BUILD}, a bad build → group fleet): phases of "
        f"{first_phase} devices (the next once half of them succeeded and all {first_phase} finished), 30 % "
        f"and the rest; one retry after a failure; abort once 10 % of at least {first_phase} finished "
        "devices failed; roll back to 1.0.0:"
    )
    final = _follow(store, action_id, deadline, progress, children)
    print(f"\nOutcome of {action_id}: {final.get('action_state', 'unknown')} in phase {final.get('phase')}")
    print(f"  reason: {final.get('reason')}")
    rollback = final.get("rollback_action_id")
    if final.get("action_state") != "ABORTED":
        return False
    if rollback is None:
        return True
    print(f"\nThe actions job wrote the rollback {rollback}:")
    done = _follow(store, rollback, deadline, progress, children)
    print(
        f"Outcome of the rollback: {done.get('action_state')}, {done.get('succeeded_count')} of "
        f"{done.get('total_count')} devices back on 1.0.0"
    )
    return done.get("action_state") == "COMPLETED"


WORKDIR_MARK = ".timestone-demo"
"""The file that says a directory is a demo's working directory (``fresh_workdir``)."""
WORKDIR_ENTRIES = frozenset({WORKDIR_MARK, "broker", "tables", "checkpoints"})
"""What a demo keeps in its working directory."""


def fresh_workdir(workdir: Path) -> int:
    """Make ``workdir`` an empty working directory, marked as the demo's, and return the descriptor of its
    mark, locked (``flock``) while this process runs. An earlier demo's (its mark, or nothing but what a demo
    keeps) is deleted first; one whose mark a running demo still locks is refused, and so is any other
    directory that is not empty (``ValueError`` naming it): ``--workdir`` given a directory of one's own
    must not delete it, nor a second demo the first one's broker log, checkpoints and tables."""
    if workdir.is_dir():
        entries = {entry.name for entry in workdir.iterdir()}
        if entries and WORKDIR_MARK not in entries and not entries <= WORKDIR_ENTRIES:
            shown = ", ".join(sorted(entries - WORKDIR_ENTRIES)[:3])
            raise ValueError(
                f"--workdir {workdir} is not empty and not a demo's working directory (it holds {shown}); "
                "the demo starts afresh in it, deleting what it holds: give it a new or empty directory"
            )
        running = _running_demo(workdir / WORKDIR_MARK)
        if running is not None:
            raise ValueError(
                f"--workdir {workdir} is in use by a demo still running ({running}): stop it, or give this "
                "one another --workdir"
            )
        shutil.rmtree(workdir)
    elif workdir.exists():
        raise ValueError(f"--workdir {workdir} is not a directory")
    try:
        workdir.mkdir(parents=True)
        mark = os.open(workdir / WORKDIR_MARK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:  # under a file, or where this user may not write
        raise ValueError(
            f"--workdir {workdir}: cannot make it the demo's working directory: {error.strerror}"
        ) from None
    fcntl.flock(mark, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: no other process has it yet
    os.write(
        mark, f"a working directory of timestone demo (pid {os.getpid()}), deleted by the next one\n".encode()
    )
    return mark


def _running_demo(mark: Path) -> str | None:
    """``pid N`` of the demo whose lock ``mark`` still holds (the kernel's: gone with the process, even
    after SIGKILL), or None."""
    try:
        descriptor = os.open(mark, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        found = re.search(r"pid \d+", os.pread(descriptor, 512, 0).decode("utf-8", "replace"))
        return found.group(0) if found else "pid unknown"
    finally:
        os.close(descriptor)
    return None


def timestone_command() -> str:
    """``timestone`` as a shell here runs this installation's: its name where PATH finds it, else its path
    (relative under the working directory: ``.venv/bin/timestone`` after ``make demo``)."""
    script = Path(sys.executable).parent / "timestone"
    found = shutil.which("timestone")
    if not script.exists() or (found is not None and Path(found).resolve() == script.resolve()):
        return "timestone"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def demo_main(argv: list[str]) -> int:
    """Entry point of ``timestone demo``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # not the loggers' levels: Great Expectations sets its own
        quiet_libraries(handler)
    workdir = Path(args.workdir).resolve()
    try:
        fresh_workdir(workdir)  # its mark stays locked until this process ends
    except ValueError as error:
        parser.error(str(error))
    tables = workdir / "tables"
    deadline = time.monotonic() + args.timeout

    print(f"Timestone demo in {workdir}")
    children = Children()
    children.install()
    atexit.register(children.stop)
    broker = children.add(
        BrokerProcess(
            workdir / "broker",
            limits={
                "max_connections": args.devices + 100,
                "new_connections_per_second": 1000.0,
                "new_connections_per_second_per_address": 1000.0,  # the simulated fleet is all on loopback
                "new_connections_burst_per_address": 2000,
            },
            logging={"level": "WARNING"},
            dies_with_parent=True,  # SIGKILL gives the demo no chance to stop it
        )
    )
    broker.start()
    print(f"  broker      MQTT 127.0.0.1:{broker.port}, offsets API {broker.offsets_url}")
    spec = FleetSpec(brokers=[broker.address], count=args.devices, groups=["canary", "fleet"], seed=11)
    behaviour = demo_behaviour(args.failure_rate, args.reject_rate)
    try:
        with BackgroundFleet(spec, behaviour) as fleet:
            print(f"  fleet       {fleet.fleet.connected()} simulated devices (groups canary, fleet)")
            return _run_pipelines(args, broker, fleet, tables, workdir, deadline, children)
    finally:
        children.stop()


def _run_pipelines(
    args,
    broker: BrokerProcess,
    fleet: BackgroundFleet,
    tables: Path,
    workdir: Path,
    deadline,
    children: Children,
) -> int:
    from pipelines.actions.config import ActionsConfig, BrokerEndpoint
    from pipelines.actions.job import start_actions_job
    from pipelines.actions.operator import NewAction, create_action
    from pipelines.spark_session import local_spark_session, stop_between_batches
    from pipelines.telemetry.config import load_telemetry_config
    from pipelines.telemetry.job import TelemetryBatch, open_store, start_query
    from sinks import open_table_store

    children.exit_if_signalled()
    print("  spark       starting a local session ...")
    spark = local_spark_session("timestone-demo")
    spark.sparkContext.setLogLevel("ERROR")
    children.install()
    children.exit_if_signalled()
    telemetry_config = load_telemetry_config(
        {
            "source": {"brokers": [f"{broker.name}={broker.offsets_url}"]},
            "tables": {"root": str(tables), "backend": "delta-rs"},
            "stream": {"checkpoint": str(workdir / "checkpoints" / "telemetry")},
        }
    )
    telemetry_store = open_store(spark, telemetry_config)
    batch = TelemetryBatch(telemetry_config, telemetry_store)
    batch.ensure_tables()
    telemetry = start_query(spark, telemetry_config, batch)
    store = open_table_store(spark, str(tables), backend="delta-rs")
    actions = start_actions_job(
        spark,
        ActionsConfig(
            tables_root=str(tables),
            checkpoint_root=str(workdir / "checkpoints" / "actions"),
            brokers=[BrokerEndpoint(name=broker.name, mqtt_port=broker.port, offsets_api=broker.offsets_url)],
        ),
        store,
    )
    print("  pipelines   telemetry (bronze → silver → gold) and actions (OTA fanout) are running")
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)
    progress = Progress()
    try:
        registered = lambda: store.read_arrow("devices").num_rows  # noqa: E731
        print("\nWaiting for the telemetry pipeline to register the fleet in the devices table:")
        if not _wait(
            lambda: registered() >= args.devices,
            deadline - time.monotonic(),
            progress,
            lambda: "  devices " + bar(registered(), args.devices),
            children,
        ):
            print("timed out waiting for devices", file=sys.stderr)
            return 1
        action_id = create_action(
            store,
            NewAction(
                group="canary",
                version="2.0.0",
                url="https://firmware.example.invalid/fw-2.0.0.bin",
                sha256="9f2c" + "0" * 60,
                size=1_048_576,
                failure_pct=50.0,
                min_executed=20,
                in_progress_timeout_s=60,
                created_by="demo",
            ),
        )
        print(f"\nWrote OTA action {action_id} (firmware 2.0.0 → group canary) to the actions table:")
        final = _follow(store, action_id, deadline, progress, children)
        completed = final.get("action_state") == "COMPLETED"
        print(f"\nOutcome of {action_id}: {final.get('action_state', 'unknown')}")
        for name in STATES:
            print(f"  {name:<12} {final.get(f'{name}_count', 0):>6}")
        if completed:
            devices = store.read_arrow("devices")
            in_fleet = devices.filter(pc.equal(devices["group"], "fleet")).num_rows
            completed = _phased_bad_build(store, in_fleet, deadline, progress, children)
        print(
            f"\nDelta tables:  {tables}/<table> (bronze_telemetry, silver_telemetry, device_minute, devices,"
        )
        print(
            "               actions, action_executions, action_summary, fleet_compliance, dq_results,"
            " telemetry_quarantine)"
        )
        print(notebooks_hint(str(tables)))
        if workdir == DEMO_WORKDIR.resolve():
            print("               (their default when run from this directory or below: no setting needed)")
        print(f"Follow-up:     {timestone_command()} ota status --tables-root {tables}")
    finally:
        if not children.stopping:  # after a signal: stop now, the running batch ends, the rest is left
            fleet.run(fleet.fleet.stop())  # no new data: the queries finish their batch and go idle
            telemetry.processAllAvailable()
        actions.stop()
        stop_between_batches(telemetry)
        batch.close()
        spark.stop()
    bronze = telemetry_store.read_arrow("bronze_telemetry").num_rows
    silver = telemetry_store.read_arrow("silver_telemetry").num_rows
    print(f"Telemetry: {bronze:,} rows in bronze, {silver:,} in silver.")
    return 0 if completed else 1
