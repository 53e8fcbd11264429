"""The demo's phased rollout of a bad build, as the README states its outcome, on 200 seeds: it is aborted by
its rule in its first phase, and no device beyond that phase is ever sent the build. And the gates end
however devices answer: a phase whose devices reject the action, or never answer, does not hold the rollout
for ever.

Each seed is one run of the rollout engine's decisions (``rollout_simulation``) with the demo's devices:
its ``--failure-rate`` and ``--reject-rate``, the bad build failing on 40 % of them, their download times;
the seed gives the action its id (so which devices make its first phase) and the devices their luck.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime

from pipelines.actions.model import Action
from pipelines.actions.operator import NewAction
from pipelines.demo import bad_build_rollout, build_parser, demo_behaviour, first_phase_size
from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import FleetSpec
from tests.unit.pipelines.actions.rollout_simulation import Outcome, RolloutSimulation

SEEDS = range(200)


def demo_fleet(devices: int) -> list[str]:
    """The devices of the demo's group ``fleet`` (every other one of ``timestone demo --devices N``)."""
    spec = FleetSpec(brokers=[("127.0.0.1", 1)], count=devices)
    return [spec.device_id(i) for i in range(devices) if spec.groups[i % len(spec.groups)] == "fleet"]


def action_of(new: NewAction, seed: int) -> Action:
    action_id = f"act-{random.Random(seed).getrandbits(48):012x}"
    return Action.from_row(replace(new, action_id=action_id).row(datetime.now(UTC)))


def simulate(new: NewAction, devices: list[str], behaviour: DeviceBehaviour, seed: int, **options) -> Outcome:
    return RolloutSimulation(action_of(new, seed), devices, behaviour, random.Random(seed), **options).run()


def test_the_demos_bad_build_is_aborted_in_its_first_phase_and_reaches_no_other_device_on_every_seed() -> (
    None
):
    defaults = build_parser().parse_args([])
    fleet = demo_fleet(defaults.devices)
    first = first_phase_size(len(fleet))
    assert (len(fleet), first) == (100, 20)
    behaviour = demo_behaviour(defaults.failure_rate, defaults.reject_rate)
    outcomes = {seed: simulate(bad_build_rollout(len(fleet)), fleet, behaviour, seed) for seed in SEEDS}

    wrong = {
        s: o
        for s, o in outcomes.items()
        if (o.state, o.aborted_by, o.phase) != ("ABORTED", "abort_rules[0]", 1)
    }
    assert not wrong, {seed: (o.state, o.phase, o.reason) for seed, o in list(wrong.items())[:5]}
    assert max(len(outcome.sent) for outcome in outcomes.values()) <= first
    assert all(o.reason.startswith("abort_rules[0] (failed) 10 % reached: ") for o in outcomes.values())
    assert all(f"of {first} finished devices failed" in o.reason for o in outcomes.values())


def test_the_demos_small_fleet_stops_in_its_first_phase_too() -> None:
    """The demo test runs 20 devices (10 in fleet): the first phase is all of them, and the rule judges it."""
    fleet = demo_fleet(20)
    behaviour = demo_behaviour(0.05, 0.02)
    for seed in range(50):
        outcome = simulate(bad_build_rollout(len(fleet)), fleet, behaviour, seed)
        assert (outcome.state, outcome.aborted_by, outcome.phase) == ("ABORTED", "abort_rules[0]", 1)


def rollout(**changes) -> NewAction:
    """Three phases of 10 devices, then the rest, over a fleet of 40: each gate asks half of its phase to
    succeed; devices that take a minute without a final report time out."""
    return replace(
        NewAction(
            group="fleet",
            version="2.0.0",
            url="https://firmware.example.invalid/fw-2.0.0.bin",
            sha256="0" * 64,
            phases=[{"devices": 10, "success_pct": 50.0}, {"devices": 10, "success_pct": 50.0}, {}],
            in_progress_timeout_s=60,
        ),
        **changes,
    )


FLEET = [f"dev-{n:05d}" for n in range(40)]
GOOD_BUILD = DeviceBehaviour(download_delay_s=(1.0, 4.0))


def test_a_phase_whose_devices_reject_the_action_loses_its_gate_rather_than_holding_the_rollout() -> None:
    rejecting = replace(GOOD_BUILD, reject_rate=0.8)
    for seed in range(20):
        outcome = simulate(rollout(), FLEET, rejecting, seed)
        assert outcome.state == "ABORTED" and outcome.phase in (1, 2), outcome
        assert outcome.aborted_by == f"phases[{outcome.phase - 1}]", outcome
        assert f"phases[{outcome.phase - 1}].success_pct 50 % cannot be reached" in outcome.reason
        assert len(outcome.sent) == 10 * outcome.phase  # no device of a later phase was sent it


def test_devices_that_never_answer_hold_a_gate_only_until_their_timeout() -> None:
    """Devices that stay silent once sent the action (off for good) count as silent after the action's
    in_progress_timeout_s: the abort rule's sample is taken from the others, and the rollout goes on."""
    new = rollout(abort_rules=[{"failure_kind": "failed", "threshold_pct": 50.0, "min_executed": 10}])
    for seed in range(20):
        action = action_of(new, seed)
        simulation = RolloutSimulation(action, FLEET, GOOD_BUILD, random.Random(seed))
        first_phase = [d for d, row in simulation.rows.items() if row.phase == 1]
        simulation.unreachable = set(first_phase[:3])
        outcome = simulation.run(limit_s=200)
        assert outcome.phase == 3 and outcome.sent == set(FLEET), outcome  # every device was sent it
        assert outcome.state == "IN_PROGRESS"  # the silent ones never finish: the action stays open


def test_without_a_timeout_a_device_that_never_answers_holds_its_gate() -> None:
    new = rollout(in_progress_timeout_s=None)
    action = action_of(new, 1)
    simulation = RolloutSimulation(action, FLEET, GOOD_BUILD, random.Random(1))
    simulation.unreachable = {d for d, row in simulation.rows.items() if row.phase == 1}
    outcome = simulation.run(limit_s=600)
    assert (outcome.state, outcome.phase, len(outcome.sent)) == ("IN_PROGRESS", 1, 10)
