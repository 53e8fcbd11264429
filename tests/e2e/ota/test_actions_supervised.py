"""The actions job restarts a failed query from its checkpoint: every device once, every report once.

Each of the two queries fails once, after its batch did all its work (the fanout published the action and
wrote the executions, the reports batch folded its reports in): Spark replays the batch after the restart,
and the writes it finds already in (their batch markers) are skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc

from pipelines.actions.operator import NewAction, create_action
from pipelines.supervisor import RestartConfig
from tests.e2e.ota.conftest import SHA256, actions_stack, summary, wait_for
from tests.fleet_harness import quiet_devices


def failing_once_after(work: Callable[..., Any], name: str, failed: list[str]) -> Callable[..., Any]:
    """``work`` raising once, after it did its writes; its result otherwise."""

    def wrapper(*args: Any) -> Any:
        result = work(*args)
        if name not in failed:
            failed.append(name)
            raise RuntimeError(f"injected failure after the {name} batch's writes")
        return result

    return wrapper


def test_each_query_failing_once_is_restarted_and_every_device_counted_once(spark, tmp_path):
    restart = RestartConfig(initial_backoff_s=0.2, max_backoff_s=1.0)
    fleet_spec = {"count": 20, "groups": ["g"]}
    with actions_stack(spark, tmp_path, fleet_spec, quiet_devices(), restart=restart) as stack:
        store, job = stack.store, stack.job
        failed: list[str] = []
        job.engine.on_action_rows = failing_once_after(job.engine.on_action_rows, "fanout", failed)
        job.engine.on_reports = failing_once_after(job.engine.on_reports, "reports", failed)
        action_id = create_action(
            store, NewAction(group="g", version="2.0.0", url="https://example.invalid/fw.bin", sha256=SHA256)
        )
        wait_for(
            lambda: (s := summary(store, action_id)) is not None and s["action_state"] == "COMPLETED",
            what="the action to complete",
        )
        assert sorted(failed) == ["fanout", "reports"]
        metrics = job.supervisor.metrics
        # each failure comes after its batch's writes: the supervisor may see it a moment after they show
        queries = ("actions-fanout", "actions-reports")
        wait_for(lambda: all(metrics.restarts("actions", q) >= 1 for q in queries), what="both restarted")
        assert metrics.restarts("actions", "actions-fanout") == 1
        assert metrics.restarts("actions", "actions-reports") == 1
        # a restart is counted when it is scheduled, its query starts after the backoff (0.2 s here)
        wait_for(lambda: len(job.queries) == 2, what="both queries running again")
        assert job.gave_up is None

        executions = store.read_arrow("action_executions")
        executions = executions.filter(pc.equal(executions["action_id"], action_id))
        devices = executions["device_id"].to_pylist()
        assert sorted(devices) == sorted(d.device_id for d in stack.fleet.devices)  # each device once
        final = dict(zip(devices, executions["state"].to_pylist(), strict=True))
        assert final == {d.device_id: d.actions[action_id].state for d in stack.fleet.devices}
        counts = summary(store, action_id)
        assert counts is not None
        assert counts["total_count"] == 20
        assert counts["succeeded_count"] == sum(1 for s in final.values() if s == "SUCCEEDED")
