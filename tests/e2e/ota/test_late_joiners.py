"""A late joiner of a group's broadcast is one of its targets by the ``devices`` registry.

Any client may subscribe to ``actions/groups/<group>`` and report as itself; before, a device of another
group (or of none) that did so created a row of that group's action, which counted towards its abort rules
and completion. Now its report is left out, named in a WARNING and counted
(``timestone_pipeline_skipped_reports_total{reason="not_a_target"}``), while a device registered in the
group, which the action did not list when it went out, still joins it, and every device's broadcast still
takes every device (docs/ota.md, "Late joiners").

Through the whole job: a real broker, Delta tables, the Spark streams; the reports come from real MQTT clients
connected with their device ids as client ids, as ``report_identity: client_id`` asks.
"""

from __future__ import annotations

import logging

from pipelines.actions.buckets import bucket_of, report_topic
from pipelines.actions.job import start_actions_job
from pipelines.actions.operator import NewAction, create_action
from pipelines.metrics import PipelineMetrics
from tests.e2e.broker_clients import PahoClient
from tests.e2e.ota.conftest import FIRMWARE, actions_stack, device_report, register_devices, summary, wait_for
from tests.e2e.ota.test_actions_job import states
from tests.fleet_harness import quiet_devices


def _skipped(metrics: PipelineMetrics, reason: str) -> float:
    labels = {"pipeline": "actions", "reason": reason}
    return metrics.registry.get_sample_value("timestone_pipeline_skipped_reports_total", labels) or 0.0


def test_a_device_outside_the_group_cannot_join_its_broadcast(spark, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="pipelines.actions.report_scope")
    metrics = PipelineMetrics()

    def job(spark, config, store):
        return start_actions_job(spark, config, store, metrics=metrics)

    with actions_stack(spark, tmp_path, {"count": 2, "groups": ["g"]}, quiet_devices(), job=job) as stack:
        store, buckets = stack.store, stack.config.device_buckets
        register_devices(store, {"dev-other": "h"})  # another group's device; dev-nobody is not registered
        group = create_action(store, NewAction(group="g", failure_pct=10, min_executed=1, **FIRMWARE))
        wait_for(
            lambda: (summary(store, group) or {}).get("action_state") == "COMPLETED",
            what="the group's action to complete",
        )
        register_devices(store, {"dev-joiner": "g"})  # registered in the group after it went out

        clients = {d: PahoClient(stack.broker.port, d) for d in ("dev-other", "dev-nobody", "dev-joiner")}
        for device, client in clients.items():
            topic = report_topic(bucket_of(device, buckets))
            client.publish(topic, device_report(group, device, "FAILED"), qos=1)
        wait_for(
            lambda: _skipped(metrics, "not_a_target") == 2 and "dev-joiner" in states(store, group),
            what="the three reports to be read",
        )
        assert states(store, group) == {
            **{d.device_id: "SUCCEEDED" for d in stack.fleet.devices},
            "dev-joiner": "FAILED",
        }
        wait_for(  # (the summary is written after the executions: read between the two, it is behind)
            lambda: (summary(store, group) or {}).get("total_count") == 3,
            what="the summary to count the joiner",
        )
        final = summary(store, group)
        assert final is not None and (final["total_count"], final["failed_count"]) == (3, 1)
        warned = [r.getMessage() for r in caplog.records if "not have in the group" in r.getMessage()]
        assert warned and "from dev-other (registered in group 'h')" in warned[0]
        assert "from dev-nobody (not registered)" in warned[0]

        # every device's broadcast takes every device, registered or not (yet)
        everyone = create_action(store, NewAction(all_devices=True, **FIRMWARE))
        wait_for(
            lambda: (summary(store, everyone) or {}).get("total_count") == 4,
            what="the broadcast to every device to go out",
        )
        topic = report_topic(bucket_of("dev-nobody", buckets))
        clients["dev-nobody"].publish(topic, device_report(everyone, "dev-nobody", "SUCCEEDED"), qos=1)
        wait_for(lambda: "dev-nobody" in states(store, everyone), what="dev-nobody to join")
        assert _skipped(metrics, "not_a_target") == 2
