"""Rollout shapes with a simulated fleet on a real broker: a constant rate, an exponential rate growing on
devices notified or on devices succeeded, and phases held back by a wait and a success threshold. Each test
reads who was sent the action when from ``action_executions`` and the outcome from ``action_summary``; the
engine's clock is moved by the test, so a rollout over days takes seconds."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from pipelines.actions.phases import Phase, phase_of_devices
from tests.e2e.ota.conftest import action_row
from tests.e2e.ota.rollout_harness import finals, rollout_run
from tests.fleet_harness import quiet_devices

DAY_S = 86_400


def sent_by(run, action_id: str, seconds: float) -> int:
    return sum(1 for at in run.published(action_id).values() if at is not None and at <= seconds)


def sent_at(run, action_id: str) -> list[float]:
    """When each device was sent the action, in seconds after the start, in order."""
    return sorted(at for at in run.published(action_id).values() if at is not None)


def test_a_constant_rate_sends_one_device_per_second_never_ahead_of_the_line(tmp_path):
    with rollout_run(tmp_path, quiet_devices(), count=6) as run:
        run.create(action_row("c-1", group="g", max_per_minute=60))
        for second in (1, 2, 2.5, 5):
            run.tick_at(second)
        assert sent_at(run, "c-1") == [0, 1, 2, 5, 5, 5]  # 2.5 s allows nothing more
        run.feed(lambda reports: finals(reports, "c-1") == 6)
        assert run.states("c-1") == Counter(SUCCEEDED=6)
        assert run.summary("c-1")["action_state"] == "COMPLETED"
        assert run.received("c-1") == {d.device_id for d in run.fleet.devices}


def test_an_exponential_rate_grows_with_devices_notified_up_to_its_ceiling(tmp_path):
    growth = {
        "base_per_minute": 60,
        "increment_factor": 2.0,
        "notified_devices": 3,
        "succeeded_devices": None,
    }
    with rollout_run(tmp_path, quiet_devices(), count=12) as run:
        run.create(action_row("e-1", group="g", max_per_minute=240, exponential_rate=growth))
        seen = [sent_by(run, "e-1", 0)]
        for second in (1, 2, 3, 3.5, 4.5, 5):
            run.tick_at(second)
            seen.append(sent_by(run, "e-1", second))
        # 1/s until 3 devices, 2/s until 6, then the ceiling of 4/s
        assert seen == [1, 2, 3, 5, 6, 10, 12]
        run.feed(lambda reports: finals(reports, "e-1") == 12)
        assert run.summary("e-1")["action_state"] == "COMPLETED"


def test_an_exponential_rate_grows_only_with_devices_that_succeeded(tmp_path):
    growth = {
        "base_per_minute": 12,
        "increment_factor": 5.0,
        "notified_devices": None,
        "succeeded_devices": 1,
    }
    for behaviour, expected in ((quiet_devices(), "grows"), (quiet_devices(failure_rate=1.0), "stays")):
        with rollout_run(tmp_path / expected, behaviour, count=20) as run:
            run.create(action_row("e-2", group="g", exponential_rate=growth))
            run.feed(lambda reports: finals(reports, "e-2") == 1)
            run.tick_at(10)
            sent = sent_by(run, "e-2", 10)
            if expected == "grows":  # the first success (within a moment of the start) made it 60/min
                assert sent >= 9
            else:  # 12/min throughout: the first device, and two more in 10 s
                assert sent == 3
                assert run.states("e-2")["FAILED"] == 1


def test_phases_days_apart_each_held_back_by_its_wait_and_success_share(tmp_path):
    phases: list[dict[str, Any]] = [
        {"percent": 10.0, "devices": None, "wait_s": DAY_S, "success_pct": 100.0},
        {"percent": 40.0, "devices": None, "wait_s": 3600, "success_pct": None},
        {"percent": None, "devices": None, "wait_s": None, "success_pct": None},
    ]
    with rollout_run(tmp_path, quiet_devices(), count=20) as run:
        run.create(action_row("p-1", group="g", phases=phases))
        rows = run.executions("p-1")
        expected = phase_of_devices("p-1", [Phase.from_row(p) for p in phases], sorted(rows))
        assert {d: r["phase"] for d, r in rows.items()} == expected
        assert Counter(expected.values()) == {1: 2, 2: 8, 3: 10}
        run.feed(lambda reports: finals(reports, "p-1") == 2)
        assert run.summary("p-1")["phase"] == 1

        run.tick_at(DAY_S - 60)  # phase 1 succeeded, but waits its day
        assert sent_by(run, "p-1", DAY_S) == 2
        run.tick_at(DAY_S)
        run.tick_at(DAY_S + 3599)
        run.tick_at(DAY_S + 3600)
        published = run.published("p-1")
        by_phase = {n: {published[d] for d, p in expected.items() if p == n} for n in (1, 2, 3)}
        assert by_phase == {1: {0}, 2: {DAY_S}, 3: {DAY_S + 3600}}
        assert run.received("p-1") == set(expected)
        run.feed(lambda reports: finals(reports, "p-1") == 20)
        summary = run.summary("p-1")
        assert (summary["action_state"], summary["phase"], summary["succeeded_count"]) == ("COMPLETED", 3, 20)


def test_a_phase_whose_devices_can_no_longer_succeed_enough_loses_its_gate_and_sends_no_further(tmp_path):
    """Every device of the first phase failed: its 100 % success share cannot be reached any more, so the
    gate is lost (the rollout is aborted, naming it) instead of holding the next phase back for ever."""
    phases = [
        {"percent": 50.0, "devices": None, "wait_s": None, "success_pct": 100.0},
        {"percent": None, "devices": None, "wait_s": None, "success_pct": None},
    ]
    with rollout_run(tmp_path, quiet_devices(failure_rate=1.0), count=4) as run:
        run.create(action_row("p-2", group="g", phases=phases))
        run.feed(lambda reports: finals(reports, "p-2") == 2)
        run.tick_at(30 * DAY_S)
        assert sent_by(run, "p-2", 30 * DAY_S) == 2
        assert run.states("p-2") == Counter(FAILED=2, CANCELED=2)
        summary = run.summary("p-2")
        assert (summary["action_state"], summary["phase"], summary["aborted_by"]) == (
            "ABORTED",
            1,
            "phases[0]",
        )
        assert summary["reason"] == (
            "phases[0].success_pct 100 % cannot be reached: 0 of its 2 devices succeeded and 0 may still, "
            "2 needed"
        )


def test_phases_cut_short_in_place_while_the_rollout_runs_still_reach_every_device(tmp_path):
    """Three phases a day apart; in the first, the operator updates the row in place (SQL ``UPDATE actions
    SET phases = ...``) to two phases, the second taking the rest. Before, the devices the job had put in
    the third phase were never sent anything (no third phase any more), and the action stayed IN_PROGRESS
    for ever; now a device of a phase the row no longer has is in its last, and all of them are reached."""
    phases: list[dict[str, Any]] = [
        {"percent": None, "devices": 1, "wait_s": DAY_S, "success_pct": None},
        {"percent": None, "devices": 1, "wait_s": DAY_S, "success_pct": None},
        {"percent": None, "devices": None, "wait_s": None, "success_pct": None},
    ]
    with rollout_run(tmp_path, quiet_devices(), count=4) as run:
        row = action_row("p-cut", group="g", phases=phases)
        run.create(row)
        assert Counter(r["phase"] for r in run.executions("p-cut").values()) == {1: 1, 2: 1, 3: 2}
        run.feed(lambda reports: finals(reports, "p-cut") == 1)
        updated = {**row, "phases": [phases[0], phases[2]], "updated_at": datetime.now(UTC)}
        run.store.merge(
            "actions",
            pa.Table.from_pylist([updated], schema=run.store.spec("actions").arrow_schema),
            "tests/update",
            0,
        )
        run.engine.on_action_rows([{**updated, "_change_type": "update_postimage"}], "fanout", 50)
        run.tick_at(DAY_S)
        run.feed(lambda reports: finals(reports, "p-cut") == 4)
        assert run.summary("p-cut")["action_state"] == "COMPLETED"
        assert set(run.published("p-cut").values()) == {0, DAY_S}
