"""Abort rules per failure kind and the rollback an abort writes, with a simulated fleet on a real broker.

A phased rollout of a bad build stops on its abort rule in its first phase: the later phases are never sent
(their devices never hear of it), the summary names the rule and the counts, and the rollback action sends
the previous version to exactly the devices that installed the bad one. Each failure kind fires its own rule.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pyarrow.compute as pc
import pytest

from pipelines.actions.buckets import DEFAULT_BUCKETS, bucket_of, report_topic
from pipelines.actions.checks import MAX_DEVICE_IDS
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.phases import Phase, phase_of_devices
from pipelines.actions.rollback import rollback_id
from pipelines.actions.states import StatusReport, apply_reports
from pipelines.actions.validation import problems
from pipelines.views import queries
from tests.e2e.broker_clients import PahoClient
from tests.e2e.ota.conftest import SHA256, action_row
from tests.e2e.ota.rollout_harness import finals, rollout_run
from tests.fleet_harness import quiet_devices

BAD_BUILD = "2.1.0"
PHASES: list[dict[str, Any]] = [
    {"percent": 25.0, "devices": None, "wait_s": 3600, "success_pct": None},
    {"percent": 25.0, "devices": None, "wait_s": 3600, "success_pct": None},
    {"percent": None, "devices": None, "wait_s": None, "success_pct": None},
]
TWO_PHASES: list[dict[str, Any]] = [
    {"percent": None, "devices": 2, "wait_s": None, "success_pct": None},
    {"percent": None, "devices": None, "wait_s": None, "success_pct": None},
]
ROLLBACK = {"version": "1.0.0", "url": "https://example.invalid/fw-1.0.0.bin", "sha256": SHA256, "size": 1024}


def rule(kind: str, pct: float, minimum: int) -> dict:
    return {"failure_kind": kind, "threshold_pct": pct, "min_executed": minimum}


def test_a_phased_rollout_of_a_bad_build_stops_in_its_first_phase_and_rolls_back(tmp_path):
    behaviour = quiet_devices(version_failure_rates={BAD_BUILD: 0.4})
    with rollout_run(tmp_path, behaviour, count=20) as run:
        devices = [d.device_id for d in run.fleet.devices]
        phase = phase_of_devices("ab-1", [Phase.from_row(p) for p in PHASES], devices)
        first = sorted(d for d in devices if phase[d] == 1)
        failing = {d for d in first if behaviour.fails_version(d, BAD_BUILD)}
        assert len(first) == 5 and 2 <= len(failing) < 5  # the simulator's bad build, on these ids

        rules = [rule("rejected", 50.0, 1), rule("failed", 40.0, 5)]
        run.create(
            action_row(
                "ab-1", group="g", version=BAD_BUILD, phases=PHASES, abort_rules=rules, rollback=ROLLBACK
            )
        )
        run.feed(lambda reports: finals(reports, "ab-1") == 5)
        summary = run.summary("ab-1")
        assert (summary["action_state"], summary["aborted_by"], summary["phase"]) == (
            "ABORTED",
            "abort_rules[1]",
            1,
        )
        share = 100 * len(failing) / 5
        assert summary["reason"] == (
            f"abort_rules[1] (failed) 40 % reached: {len(failing)} of 5 finished devices failed "
            f"({share:.1f} %; abort_rules[1].min_executed 5); "
            f"rollback ab-1-rollback to 1.0.0 written for {5 - len(failing)} device"
            + ("" if 5 - len(failing) == 1 else "s")
        )
        executions = run.executions("ab-1")
        for device_id, row in executions.items():
            if phase[device_id] == 1:
                assert row["state"] == ("FAILED" if device_id in failing else "SUCCEEDED")
            else:  # never sent: canceled where they were queued
                assert (row["state"], row["published_at"]) == ("CANCELED", None)
                assert row["status_details"] == "action aborted: abort_rules[1] reached"
        run.tick_at(10 * 3600)  # the later phases' waits are long over: nothing more goes out
        assert run.received("ab-1") == set(first)
        after = run.summary("ab-1")
        assert (after["action_state"], after["canceled_count"], after["total_count"]) == ("ABORTED", 15, 20)

        actions = run.store.read_arrow("actions")
        rollback = actions.filter(pc.equal(actions["id"], rollback_id("ab-1"))).to_pylist()
        assert len(rollback) == 1 and summary["rollback_action_id"] == "ab-1-rollback"
        installed = sorted(set(first) - failing)
        assert rollback[0]["target"]["device_ids"] == installed
        assert rollback[0]["payload"]["version"] == "1.0.0"
        assert {d.firmware for d in run.fleet.devices if d.device_id in installed} == {BAD_BUILD}

        run.engine.on_action_rows(rollback, "fanout", 99)  # as the job's change feed hands it over
        run.feed(lambda reports: finals(reports, "ab-1-rollback") == len(installed))
        assert run.summary("ab-1-rollback")["action_state"] == "COMPLETED"
        assert {d.device_id: d.firmware for d in run.fleet.devices if d.device_id in set(first)} == {
            d: "1.0.0" for d in first
        }
        assert run.received("ab-1-rollback") == set(installed)


@pytest.mark.parametrize(
    ("kind", "behaviour", "timeout_s"),
    [
        ("failed", {"failure_rate": 1.0}, None),
        ("rejected", {"reject_rate": 1.0}, None),
        ("timed_out", {"silent_attempts": 99}, 60),
    ],
)
def test_each_failure_kind_fires_its_own_rule(tmp_path, kind, behaviour, timeout_s):
    rules = [rule("failed", 50.0, 3), rule("rejected", 50.0, 3), rule("timed_out", 50.0, 3)]
    with rollout_run(tmp_path, quiet_devices(**behaviour), count=3) as run:
        devices = [d.device_id for d in run.fleet.devices]
        run.create(action_row("k-1", device_ids=devices, abort_rules=rules, timeout_s=timeout_s))
        if timeout_s:
            run.feed(lambda reports: sum(r.state == "IN_PROGRESS" for r in reports) == 3)
            run.tick_after_reports(timeout_s + 1)
        else:
            run.feed(lambda reports: finals(reports, "k-1") == 3)
        summary = run.summary("k-1")
        index = ["failed", "rejected", "timed_out"].index(kind)
        assert (summary["action_state"], summary["aborted_by"]) == ("ABORTED", f"abort_rules[{index}]")
        assert summary["reason"].startswith(
            f"abort_rules[{index}] ({kind}) 50 % reached: 3 of 3 finished devices"
        )
        assert summary["rollback_action_id"] is None


def test_any_failure_kind_counts_failures_rejections_and_timeouts_together(tmp_path):
    with rollout_run(tmp_path, quiet_devices(failure_rate=0.5, reject_rate=0.5), count=8) as run:
        devices = [d.device_id for d in run.fleet.devices]
        rules = [rule("failed", 90.0, 8), rule("rejected", 90.0, 8), rule("any", 60.0, 8)]
        run.create(action_row("k-any", device_ids=devices, abort_rules=rules))
        run.feed(lambda reports: finals(reports, "k-any") == 8)
        outcome = run.fleet.states("k-any")
        bad = outcome["FAILED"] + outcome["REJECTED"]
        assert max(outcome["FAILED"], outcome["REJECTED"]) < 8 * 0.9 <= 8  # neither kind alone is enough
        assert bad * 100 >= 60 * 8  # this fleet's seed: together they cross the 60 % of the rule on "any"
        summary = run.summary("k-any")
        assert (summary["action_state"], summary["aborted_by"]) == ("ABORTED", "abort_rules[2]")
        assert f"{bad} of 8 finished devices failed, rejected it or timed out" in summary["reason"]


def test_a_rollback_whose_id_another_action_holds_is_not_said_to_be_written(tmp_path):
    """An operator's own action already holds ``<id>-rollback`` (a command to other devices): the abort writes
    no rollback under that id and says so, where the summary named that action as the rollback, 'written
    for' the devices that installed the build, and none of them was sent the previous version."""
    behaviour = quiet_devices(version_failure_rates={BAD_BUILD: 0.5})
    with rollout_run(tmp_path, behaviour, count=8) as run:
        devices = sorted(d.device_id for d in run.fleet.devices)
        failing = {d for d in devices if behaviour.fails_version(d, BAD_BUILD)}
        assert 0 < len(failing) < len(devices)
        reboot = {
            "version": None,
            "url": None,
            "sha256": None,
            "size": None,
            "command": "reboot",
            "args": None,
        }
        run.create(action_row("ab-3-rollback", kind="command", device_ids=["elsewhere-1"], payload=reboot))
        run.create(
            action_row(
                "ab-3", group="g", version=BAD_BUILD, abort_rules=[rule("failed", 10.0, 8)], rollback=ROLLBACK
            )
        )
        run.feed(lambda reports: finals(reports, "ab-3") == len(devices))
        summary = run.summary("ab-3")
        assert summary["action_state"] == "ABORTED" and summary["rollback_action_id"] is None
        assert summary["reason"].endswith(
            "; rollback not written: id: ab-3-rollback is the id of another action (created by tests): "
            "write the rollback under another id"
        )
        actions = run.store.read_arrow("actions")
        taken = actions.filter(pc.equal(actions["id"], "ab-3-rollback")).to_pylist()
        assert [row["kind"] for row in taken] == ["command"]


def test_reports_from_devices_of_a_later_phase_not_sent_the_action_change_nothing(tmp_path):
    """Devices of the second phase, never sent the action, report FAILED on their buckets' report topics
    (a real MQTT client): before, each report moved its QUEUED row to FAILED and the abort rule fired on
    devices that never had the build; now they change no row and no count, and the first phase completes."""
    phases = [
        dict(PHASES[0], wait_s=0),
        {"percent": None, "devices": None, "wait_s": None, "success_pct": None},
    ]
    with rollout_run(tmp_path, quiet_devices(), count=8) as run:
        devices = [d.device_id for d in run.fleet.devices]
        phase = phase_of_devices("lp-1", [Phase.from_row(p) for p in phases], devices)
        later = sorted(d for d in devices if phase[d] == 2)
        run.create(action_row("lp-1", group="g", phases=phases, abort_rules=[rule("failed", 10.0, 1)]))
        client = PahoClient(run.broker.port, client_id="later-phase")
        for device_id in later:
            body = {
                "action_id": "lp-1",
                "device_id": device_id,
                "state": "FAILED",
                "seq": 1,
                "ts": 1,
                "details": "spoofed",
            }
            client.publish(
                report_topic(bucket_of(device_id, DEFAULT_BUCKETS)), json.dumps(body).encode(), qos=1
            )
        run.feed(
            lambda reports: (
                (states := Counter(r.state for r in reports))["SUCCEEDED"] == 2
                and states["FAILED"] == len(later)
            )
        )
        summary = run.summary("lp-1")
        assert (summary["action_state"], summary["failed_count"], summary["succeeded_count"]) == (
            "IN_PROGRESS",
            0,
            2,
        )
        assert {d: r["state"] for d, r in run.executions("lp-1").items() if d in later} == dict.fromkeys(
            later, "QUEUED"
        )
        run.tick_at(1)  # the first phase is done: the second goes out to the devices that reported
        run.feed(lambda reports: sum(r.state == "SUCCEEDED" for r in reports) == len(devices))
        assert run.summary("lp-1")["action_state"] == "COMPLETED"
        assert run.received("lp-1") == set(devices)


def test_a_rollback_of_more_devices_than_one_action_lists_reaches_every_one_of_them(tmp_path):
    """A group of 100,050 devices installs a build, then 50 more fail it and the abort rule fires. One
    action lists at most 100,000 devices: before, the rollback row listed the first 100,000 by id and the
    reason said 'written for 100,050 devices', so 50 devices stayed on the bad build without a word. Now
    the rollback is as many actions as the list needs, ``<id>-rollback`` then ``<id>-rollback-2``, and the
    reason names both."""
    installed = [f"d{i:06d}" for i in range(MAX_DEVICE_IDS + 50)]
    failing = [f"f{i:02d}" for i in range(50)]
    with rollout_run(tmp_path, quiet_devices(), count=0, register=False) as run:
        run.register(dict.fromkeys(installed + failing, "big"))
        run.create(
            action_row(
                "huge",
                group="big",
                abort_rules=[rule("failed", 0.04, len(installed) + 50)],
                rollback=ROLLBACK,
            )
        )
        at = run.clock.now = run.clock.now + 60_000  # a minute later, when the reports come
        reports = [StatusReport("huge", d, "SUCCEEDED", 1, at, received_at=at) for d in installed]
        reports += [StatusReport("huge", d, "FAILED", 1, at, received_at=at) for d in failing]
        run.engine.on_reports(reports, "reports", 0)
        summary = run.summary("huge")
        assert (summary["action_state"], summary["rollback_action_id"]) == ("ABORTED", "huge-rollback")
        assert summary["reason"].endswith(
            "rollback huge-rollback to 1.0.0 written for 100050 devices in 2 actions: huge-rollback, "
            "huge-rollback-2"
        )
        actions = run.store.read_arrow("actions")
        rows = {r["id"]: r for r in actions.to_pylist() if r["id"].startswith("huge-rollback")}
        assert sorted(rows) == ["huge-rollback", "huge-rollback-2"]
        listed = [d for r in rows.values() for d in r["target"]["device_ids"]]
        assert sorted(listed) == installed and all(problems(r) == [] for r in rows.values())
        assert queries.latest_action_id(run.store) == "huge"  # the notebook's action, not a rollback's part


@pytest.mark.parametrize("after_s", [61, 60])
def test_devices_timing_out_at_a_tick_abort_the_rollout_before_that_tick_sends_the_next_phase(
    tmp_path, after_s
):
    """The first phase's two devices hang after IN_PROGRESS and the tick after their in-progress timeout
    ends them TIMED_OUT, which fires the rule on timeouts. Before, that same tick then found the phase's
    sample complete, opened the second phase and sent it the build, and only afterwards aborted the action:
    four devices beyond the gate received the build (and a cancel right after). Now the tick sends nothing
    once a rule fires on the rows it has just ended: the second phase never hears of the action. A tick
    exactly ``in_progress_timeout_s`` after the last device started (60 s) times it out too: before, it
    counted as silent there (out of the gate's sample) but not yet TIMED_OUT (for the rule)."""
    phases = TWO_PHASES
    with rollout_run(tmp_path, quiet_devices(silent_attempts=99), count=6) as run:
        devices = [d.device_id for d in run.fleet.devices]
        phase = phase_of_devices("to-1", [Phase.from_row(p) for p in phases], devices)
        first = {d for d in devices if phase[d] == 1}
        rules = [rule("timed_out", 50.0, 2)]
        run.create(action_row("to-1", group="g", phases=phases, abort_rules=rules, timeout_s=60))
        run.feed(lambda reports: sum(r.state == "IN_PROGRESS" for r in reports) == 2)
        run.tick_after_reports(after_s)
        summary = run.summary("to-1")
        assert (summary["action_state"], summary["aborted_by"], summary["phase"]) == (
            "ABORTED",
            "abort_rules[0]",
            1,
        )
        executions = run.executions("to-1")
        assert {d for d, r in executions.items() if r["published_at"] is not None} == first
        assert {d: r["state"] for d, r in executions.items() if d not in first} == dict.fromkeys(
            set(devices) - first, "CANCELED"
        )
        assert run.received("to-1") == first


def test_a_job_killed_before_it_aborted_sends_no_further_phase_when_it_starts_again(tmp_path):
    """Both devices of the first phase report FAILED and the job is killed after its report batch wrote
    their rows, before it summarised them (where the abort happens). Before, the restarted job's first tick
    found the phase's sample complete, sent the second phase the build and only then aborted; now that tick
    aborts the action and no device beyond the first phase is sent anything."""
    phases = TWO_PHASES
    with rollout_run(tmp_path, quiet_devices(failure_rate=1.0), count=6) as run:
        devices = [d.device_id for d in run.fleet.devices]
        phase = phase_of_devices("kr-1", [Phase.from_row(p) for p in phases], devices)
        first = {d for d in devices if phase[d] == 1}
        run.create(action_row("kr-1", group="g", phases=phases, abort_rules=[rule("failed", 50.0, 2)]))
        run.harness.wait_until(lambda: finals(list(run.harness.reports), "kr-1") == 2, 20)
        reports = run.harness.take_reports()
        known = run.engine.tables.executions(["kr-1"])["kr-1"]
        failed = [apply_reports(known[d], [r for r in reports if r.device_id == d]) for d in sorted(first)]
        written = [row for row in failed if row is not None]
        run.engine.tables.write_executions(written, "reports/executions", 0)
        assert run.summary("kr-1")["action_state"] == "IN_PROGRESS"  # killed here, before its summary

        again = ActionsEngine(run.store, run.engine.publisher, clock=run.clock, compliance_interval_s=0)
        run.clock.now += 1000
        again.tick()
        summary = run.summary("kr-1")
        assert (summary["action_state"], summary["aborted_by"], summary["phase"]) == (
            "ABORTED",
            "abort_rules[0]",
            1,
        )
        executions = run.executions("kr-1")
        assert {d for d, r in executions.items() if r["published_at"] is not None} == first
        assert run.received("kr-1") == first


def test_an_abort_rolls_back_the_devices_that_had_the_build_and_had_not_reported_its_end(tmp_path):
    """An abort rule fires while devices are IN_PROGRESS with the build as far as the job has read (a job
    started again whose first tick aborts before its reports stream read their SUCCEEDED, a final report
    still on its way): they are sent the cancel message, which may come after they installed it, and the
    rollback left them out, so they kept the bad build. The rollback now goes to every device that had the
    build and had not reported a final state (one that never installed it is already at that version and
    says so at once)."""
    with rollout_run(tmp_path, quiet_devices(), count=3) as run:
        fleet = sorted(d.device_id for d in run.fleet.devices)
        rules = [rule("timed_out", 10.0, 1)]
        row = action_row("ip-1", device_ids=["r-silent", *fleet], timeout_s=60, abort_rules=rules)
        run.create(row | {"rollback": ROLLBACK})
        run.harness.wait_until(lambda: finals(list(run.harness.reports), "ip-1") == 3, 20)
        later = run.clock.at(30)  # the devices started half a minute after the silent one
        started = [
            replace(r, received_at=later) for r in run.harness.take_reports() if r.state == "IN_PROGRESS"
        ]
        started.append(
            StatusReport("ip-1", "r-silent", "IN_PROGRESS", 1, run.clock.now, received_at=run.clock.now)
        )
        run.engine.on_reports(started, "reports", 0)  # their SUCCEEDED not read yet
        run.tick_at(61)
        summary = run.summary("ip-1")
        assert (summary["action_state"], summary["rollback_action_id"]) == ("ABORTED", "ip-1-rollback")
        actions = run.store.read_arrow("actions")
        rollback = actions.filter(pc.equal(actions["id"], rollback_id("ip-1"))).to_pylist()
        assert rollback[0]["target"]["device_ids"] == fleet
        run.engine.on_action_rows(rollback, "fanout", 99)
        run.feed(lambda reports: finals(reports, "ip-1-rollback") == 3)
        assert {d.firmware for d in run.fleet.devices} == {"1.0.0"}
