"""Continuous actions and the compliance view, with a simulated fleet on a real broker.

A continuous action for a group reaches the devices that join the group in the ``devices`` table after it
started, and stays open until it is ended (``timestone ota end``); an action that is not continuous does not.
``fleet_compliance`` counts each group's devices by installed version against the desired one.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pipelines.actions.operator import action_row as stored_row
from pipelines.actions.operator import end_action
from tests.e2e.ota.conftest import action_row
from tests.e2e.ota.rollout_harness import finals, rollout_run
from tests.fleet_harness import quiet_devices


def compliance(run) -> dict[tuple[str, str], tuple[int, str | None, bool]]:
    rows = run.store.read_arrow("fleet_compliance").to_pylist()
    return {
        (r["group"], r["installed_version"]): (r["devices"], r["desired_version"], r["on_desired"])
        for r in rows
    }


def test_devices_joining_the_group_later_get_a_continuous_action_until_it_ends(tmp_path):
    with rollout_run(tmp_path, quiet_devices(), count=5, groups=["g", "g", "g", "late", "late"]) as run:
        devices = [d.device_id for d in run.fleet.devices]
        first, joiners = devices[:3], devices[3:]
        run.create(action_row("cont-1", group="g", continuous=True))
        run.create(action_row("once-1", group="g", version="2.0.0"))
        run.feed(lambda reports: finals(reports, "cont-1") == 3 and finals(reports, "once-1") == 3)
        summary = run.summary("cont-1")
        assert (summary["action_state"], summary["succeeded_count"]) == ("IN_PROGRESS", 3)  # open-ended
        assert run.summary("once-1")["action_state"] == "COMPLETED"

        run.register({d: "g" for d in joiners})  # they join the group
        run.tick_at(10)
        joined = run.executions("cont-1")
        assert sorted(joined) == sorted(devices)
        assert {d: run.published("cont-1")[d] for d in joiners} == {d: 10 for d in joiners}
        run.feed(lambda reports: finals(reports, "cont-1") == 5)
        assert run.received("cont-1") == set(devices)
        assert sorted(run.executions("once-1")) == sorted(first)  # not continuous: the group as it was
        assert run.received("once-1") == set(first)
        assert run.summary("cont-1")["action_state"] == "IN_PROGRESS"

        end_action(run.store, "cont-1", at=datetime.fromtimestamp(run.clock.at(20) / 1000, UTC))
        updated = stored_row(run.store, "cont-1")
        assert updated is not None and updated["schedule"]["end_at"] is not None
        run.engine.on_action_rows([updated], "fanout", 500)
        run.register({"dev-registered-after-the-end": "g"})
        run.tick_at(30)
        assert "dev-registered-after-the-end" not in run.executions("cont-1")
        summary = run.summary("cont-1")
        assert (summary["action_state"], summary["succeeded_count"], summary["total_count"]) == (
            "COMPLETED",
            5,
            5,
        )


def test_compliance_counts_each_groups_devices_by_installed_against_desired_version(tmp_path):
    behaviour = quiet_devices(version_failure_rates={"2.0.0": 0.34})
    with rollout_run(tmp_path, behaviour, count=6, groups=["canary", "fleet"]) as run:
        canary = [d.device_id for d in run.fleet.devices if d.group == "canary"]
        failing = {d for d in canary if behaviour.fails_version(d, "2.0.0")}
        assert 0 < len(failing) < len(canary)
        run.tick_at(0)
        assert compliance(run) == {
            ("canary", "1.0.0"): (3, None, False),
            ("fleet", "1.0.0"): (3, None, False),
        }

        run.create(action_row("comp-1", group="canary", version="2.0.0"))
        run.feed(lambda reports: finals(reports, "comp-1") == 3)
        run.tick_at(1)
        installed = len(canary) - len(failing)
        assert compliance(run) == {
            ("canary", "2.0.0"): (installed, "2.0.0", True),
            ("canary", "1.0.0"): (len(failing), "2.0.0", False),
            ("fleet", "1.0.0"): (3, None, False),
        }

        run.create(
            action_row("comp-2", all_devices=True, version="1.0.0", cancel=True)
        )  # canceled: not desired
        run.tick_at(2)
        assert compliance(run)[("fleet", "1.0.0")] == (3, None, False)
