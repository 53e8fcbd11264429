"""A phased rollout of a bad build through the actions job itself: the row from ``ota create``'s code, the
change feed, the broker's logs, device reports with their attempts through the ``timestone`` source. The
first phase's failures are retried once, fail again, abort the action before its second phase, and the
rollback the abort writes to ``actions`` is fanned out by the job's own change feed to the devices that
installed the bad build."""

from __future__ import annotations

from pipelines.actions.operator import NewAction, create_action
from pipelines.actions.phases import Phase, phase_of_devices
from tests.e2e.ota.conftest import SHA256, actions_stack, summary, wait_for
from tests.fleet_harness import quiet_devices

BAD_BUILD = "2.1.0"


def test_the_job_retries_aborts_a_phased_bad_build_and_rolls_it_back(spark, tmp_path):
    behaviour = quiet_devices(version_failure_rates={BAD_BUILD: 0.4})
    with actions_stack(spark, tmp_path, {"count": 20, "groups": ["g"]}, behaviour) as stack:
        store, fleet = stack.store, stack.fleet
        phases = [{"percent": 25.0, "success_pct": 100.0}, {}]
        action = NewAction(
            action_id="job-bad",
            group="g",
            version=BAD_BUILD,
            url="https://example.invalid/fw-2.1.0.bin",
            sha256=SHA256,
            phases=phases,
            abort_rules=[{"failure_kind": "failed", "threshold_pct": 40.0, "min_executed": 5}],
            retries=[{"failure_kind": "failed", "max_retries": 1}],
            rollback={"version": "1.0.0", "url": "https://example.invalid/fw-1.0.0.bin", "sha256": SHA256},
        )
        create_action(store, action)
        devices = [d.device_id for d in fleet.devices]
        first = {
            d
            for d, n in phase_of_devices("job-bad", [Phase.from_row(p) for p in phases], devices).items()
            if n == 1
        }
        failing = {d for d in first if behaviour.fails_version(d, BAD_BUILD)}
        assert len(first) == 5 and 2 <= len(failing) < 5

        wait_for(lambda: (summary(store, "job-bad") or {}).get("action_state") == "ABORTED", what="the abort")
        aborted = summary(store, "job-bad")
        assert aborted is not None
        assert (
            aborted["aborted_by"] == "abort_rules[0]" and aborted["rollback_action_id"] == "job-bad-rollback"
        )
        assert (aborted["failed_count"], aborted["canceled_count"], aborted["retries_count"]) == (
            len(failing),
            15,
            len(failing),
        )
        wait_for(
            lambda: (summary(store, "job-bad-rollback") or {}).get("action_state") == "COMPLETED",
            what="the rollback",
        )
        installed = first - failing
        rolled_back = summary(store, "job-bad-rollback")
        assert rolled_back is not None and rolled_back["succeeded_count"] == len(installed)
        assert {d.device_id for d in fleet.devices if "job-bad" in d.actions} == first
        assert {d.device_id: d.firmware for d in fleet.devices if d.device_id in first} == dict.fromkeys(
            first, "1.0.0"
        )
        assert fleet.stats["retries_received"] == len(failing)
    # the job, stopped, brought the compliance table up to date: nobody is left on the bad build; an aborted
    # action is no group's desired version, and a rollback to a list of devices neither
    compliance = {
        (r["group"], r["installed_version"]): (r["devices"], r["desired_version"])
        for r in store.read_arrow("fleet_compliance").to_pylist()
    }
    assert compliance == {("g", "1.0.0"): (20, None)}
