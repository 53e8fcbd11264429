"""What makes a peer-benchmark row count: the load generator kept up, nothing acknowledged was lost, a
persisting broker persisted; invalid rows take part in no ratio. Plus the peers' setups that make the
comparison fair (Mosquitto's data directory, Aedes running, publishers over several processes)."""

from __future__ import annotations

import dataclasses
import time

from bench.brokers import Aedes, Mosquitto
from bench.loadgen.flow import FlowResult, Timing, run_flow
from bench.report import scenario_table
from bench.scenarios import fanin
from bench.scenarios.base import Row, ScenarioResult
from bench.scenarios.throughput import more_processes, verdict
from bench.sysinfo import dir_bytes

SHORT = Timing(warmup_s=0.3, measure_s=0.7, drain_s=4.0, connect_timeout_s=20.0)
FANIN = dataclasses.replace(fanin.spec(1), ahead=2000)


def flow_result(per_process: list[float], expected: int = 100, delivered: int = 100) -> FlowResult:
    return FlowResult(
        published_per_s=1000.0,
        delivered_per_s=1000.0,
        sent=100,
        acked=100,
        delivered=delivered,
        expected=expected,
        min_per_subscriber=delivered,
        stalls=0,
        broker_cpu_pct=100.0,
        loadgen_cpu_pct=sum(per_process),
        other_cpu_pct=0.0,
        broker_rss_bytes=0,
        loadgen_process_cpu_pct=per_process,
    )


def test_a_saturated_load_generator_or_a_lost_acknowledged_message_makes_a_run_invalid() -> None:
    assert verdict(flow_result([40.0, 30.0]), FANIN, loadgen_cpus=1) == ""
    assert "one process at 95%" in verdict(flow_result([95.0, 3.0]), FANIN, loadgen_cpus=1)
    assert "its 1 CPU(s) at 92%" in verdict(flow_result([50.0, 42.0]), FANIN, loadgen_cpus=1)
    assert "7 acknowledged deliveries never made" in verdict(flow_result([10.0], 107), FANIN, 1)


def test_more_processes_only_while_the_load_generator_has_cpu_left() -> None:
    wider = more_processes(FANIN, flow_result([95.0, 20.0]), loadgen_cpus=3)
    assert wider is not None and (wider.publisher_processes, wider.subscriber_processes) == (2, 1)
    assert more_processes(FANIN, flow_result([95.0, 20.0]), loadgen_cpus=1) is None


def test_invalid_rows_are_marked_and_left_out_of_ratios_and_targets() -> None:
    rows = [
        Row("QoS 1", "timestone", 80_000.0),
        Row("QoS 1", "mosquitto", 30_000.0, invalid="load generator saturated: one process at 99%"),
        Row("QoS 1", "aedes", 20_000.0),
    ]
    result = ScenarioResult("fanin", "Fan-in", "", "delivered/s", True, [], rows)
    table = "\n".join(scenario_table(result))

    assert "| QoS 1 | mosquitto | 30,000 **(invalid)** | n/a |" in table
    assert "INVALID: load generator saturated" in table
    assert "| QoS 1 | aedes | 20,000 | 4.00 |" in table
    assert result.figure("QoS 1", "mosquitto") is None


def test_publishers_spread_over_processes_deliver_every_acknowledged_message() -> None:
    spec = dataclasses.replace(FANIN, publisher_processes=2)
    with Mosquitto().running() as broker:
        result = run_flow(broker, spec, SHORT, cpus=None)
    assert result.acked == result.sent > 0
    assert result.delivered == result.expected == result.acked
    assert len(result.loadgen_process_cpu_pct) == 3  # two publisher processes and the subscriber's


def test_mosquitto_with_persistence_writes_its_data_directory() -> None:
    """Run as root, Mosquitto drops to its own account: that account must be able to write the snapshot.

    Its first snapshot comes once more than `autosave_interval` (1 s) of its own clock has passed, from its
    main loop: on a machine whose cores are busy with other tests that may take several seconds."""
    with Mosquitto(persistence=True).running() as broker:
        deadline = time.monotonic() + 30
        while dir_bytes(broker.data_dir) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        log = (broker.workdir / "broker.log").read_text()
        assert dir_bytes(broker.data_dir) > 0, f"{sorted(broker.data_dir.iterdir())}\n{log}"
        assert "Permission denied" not in log


def test_aedes_delivers_every_acknowledged_message() -> None:
    Aedes().prepare()
    with Aedes().running() as broker:
        result = run_flow(broker, FANIN, SHORT, cpus=None)
    assert result.acked == result.sent > 0
    assert result.delivered == result.expected == result.acked


def test_mosquitto_queues_without_limit_and_its_drop_notices_are_reported() -> None:
    """No `max_queued_messages` limit (2.0.11 dropped acknowledged deliveries below its limit), notices
    logged, and its drop notice recognised in the log; the other brokers recognise none."""
    with Mosquitto().running() as broker:
        config = (broker.workdir / "mosquitto.conf").read_text().splitlines()
    assert "max_queued_messages 0" in config
    assert "log_type notice" in config
    log = "1: Outgoing messages are being dropped for client bench-sub0-0.\n" * 2
    assert Mosquitto().drop_notice(log) == 'Mosquitto logged "Outgoing messages are being dropped" 2x'
    assert Mosquitto().drop_notice("1: mosquitto version 2.0.11 running\n") == ""
    assert Aedes().drop_notice(log) == ""
