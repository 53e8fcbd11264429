"""One action the brokers refuse does not hold the others back: the ticker sends, times out and aborts every
other action, records what it sent, and never sends it again."""

from __future__ import annotations

import logging

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.publisher import MqttPublisher
from tests.e2e.ota.conftest import action_row, summary, write_actions
from tests.e2e.ota.rollout_harness import ManualClock, finals
from tests.fleet_harness import FleetHarness, FleetSpec, quiet_devices

TOPIC_QUOTA = {"max_topics_per_client": 3, "messages_per_second_per_client": 0}
"""The job's client may create 3 topics: per-device topics (``device_buckets: 0``) for 3 devices."""
ONE_TOPIC = {"max_topics_per_client": 1, "messages_per_second_per_client": 0}


def test_an_action_its_broker_refuses_leaves_the_others_rolling_out_and_sent_once(
    tmp_path, table_store, caplog: pytest.LogCaptureFixture
):
    """``b-over`` needs more topics than the broker's quota lets the job create: its publishes are refused
    (0x97). ``a-within`` goes on at its rate, each of its devices sent the action once and completing, where
    every tick failed on ``b-over``: ``a-within``'s turn was sent but never recorded, so it was sent again
    at every tick, and no action's timeout or abort was looked at."""
    with BrokerProcess(tmp_path / "broker", limits=TOPIC_QUOTA) as broker:
        spec = FleetSpec(brokers=[broker.address], count=5, groups=["g"])
        with FleetHarness(broker.address, spec, quiet_devices()) as harness:
            devices = sorted(d.device_id for d in harness.fleet.devices)
            clock = ManualClock()
            publisher = MqttPublisher([broker.address], client_id="actions-test")
            engine = ActionsEngine(table_store, publisher, clock=clock, device_buckets=0)
            try:
                for batch, row in enumerate(
                    [
                        action_row("a-within", device_ids=devices[:2], max_per_minute=60),
                        action_row("b-over", device_ids=devices[2:], max_per_minute=60),
                    ]
                ):
                    write_actions(table_store, [row], batch)
                    engine.on_action_rows([row], "fanout", batch)
                with caplog.at_level(logging.WARNING):
                    for second in range(1, 6):
                        clock.now = clock.at(second)
                        engine.tick()
                assert any("b-over" in r.getMessage() and "0x97" in r.getMessage() for r in caplog.records)
                harness.wait_until(lambda: finals(list(harness.reports), "a-within") == 2)
                engine.on_reports(harness.take_reports(), "reports", 0)
                done = summary(table_store, "a-within")
                assert done is not None and (done["action_state"], done["succeeded_count"]) == (
                    "COMPLETED",
                    2,
                )
                with OffsetsClient(broker.offsets_url) as offsets:
                    logged = {log.topic: log.end_offset for log in offsets.list_logs("actions/devices/+")}
                assert {f"actions/devices/{d}": 1 for d in devices[:2]}.items() <= logged.items(), logged
            finally:
                publisher.close()


def test_an_action_refused_at_its_fan_out_is_queued_for_the_ticker_and_the_next_actions_go_out(
    tmp_path, table_store, caplog: pytest.LogCaptureFixture
):
    """``b-over`` is refused as it is fanned out (the job may create one topic, ``a-within``'s, which
    ``c-later`` uses again), in one change-feed batch with ``a-within``: the batch
    records both (``a-within`` sent, ``b-over`` queued, unsent, with a WARNING), the next batch's action goes
    out, and the ticker, of this engine and of one started afresh, tries ``b-over`` again. Before, the
    batch failed, and the job replayed it for ever: no later action was fanned out again."""
    with BrokerProcess(tmp_path / "broker", limits=ONE_TOPIC) as broker:
        spec = FleetSpec(brokers=[broker.address], count=5, groups=["g"])
        with FleetHarness(broker.address, spec, quiet_devices()) as harness:
            devices = sorted(d.device_id for d in harness.fleet.devices)
            publisher = MqttPublisher([broker.address], client_id="actions-test")
            try:
                engine = ActionsEngine(table_store, publisher, device_buckets=0)
                first = [
                    action_row("a-within", device_ids=devices[:1]),
                    action_row("b-over", device_ids=devices[1:5]),
                ]
                write_actions(table_store, first, 0)
                with caplog.at_level(logging.WARNING):
                    engine.on_action_rows(first, "fanout", 0)
                    later = action_row("c-later", version="3.0.0", device_ids=devices[:1])
                    write_actions(table_store, [later], 1)
                    engine.on_action_rows([later], "fanout", 1)
                assert any("b-over" in r.getMessage() and "0x97" in r.getMessage() for r in caplog.records)
                harness.wait_until(
                    lambda: (
                        finals(list(harness.reports), "a-within") + finals(list(harness.reports), "c-later")
                        == 2
                    )
                )
                engine.on_reports(harness.take_reports(), "reports", 0)
                for action_id in ("a-within", "c-later"):
                    row = summary(table_store, action_id)
                    assert row is not None and row["action_state"] == "COMPLETED", row
                held = summary(table_store, "b-over")
                assert held is not None and (held["action_state"], held["queued_count"]) == ("IN_PROGRESS", 4)

                caplog.clear()
                with caplog.at_level(logging.WARNING):
                    ActionsEngine(table_store, publisher, device_buckets=0).tick()  # a job started afresh
                assert any("b-over held back" in r.getMessage() for r in caplog.records), caplog.records
            finally:
                publisher.close()
