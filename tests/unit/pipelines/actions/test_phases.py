"""Phases of a rollout: their sizes, which devices are in each, and when each starts."""

from __future__ import annotations

from dataclasses import replace

from pipelines.actions.phases import Gate, Phase, gate_lost, phase_of_devices, phase_sizes, phase_starts
from pipelines.actions.states import EXPIRED, FAILED, IN_PROGRESS, REJECTED, SUCCEEDED, queued

MENDER = (Phase(percent=5.0, wait_s=86_400), Phase(percent=15.0, wait_s=86_400), Phase())


def test_sizes_round_up_on_the_running_share_and_the_last_takes_the_rest():
    assert phase_sizes(MENDER, 100) == [5, 15, 80]
    assert phase_sizes(MENDER, 10) == [1, 1, 8]
    assert phase_sizes(MENDER, 0) == [0, 0, 0]
    counted = (Phase(devices=10), Phase(percent=30.0), Phase())
    assert phase_sizes(counted, 100) == [10, 30, 60]
    assert phase_sizes(counted, 5) == [5, 0, 0]


def test_each_phase_is_a_spread_sample_the_same_every_time():
    devices = [f"dev-{i:05d}" for i in range(100)]
    phases = phase_of_devices("act-1", MENDER, devices)
    first = sorted(d for d, p in phases.items() if p == 1)
    assert len(first) == 5 and first != devices[:5]
    assert phase_of_devices("act-1", MENDER, reversed(devices)) == phases
    assert phase_of_devices("act-2", MENDER, devices) != phases


def row(device: str, phase: int, published: int | None, state: str = "QUEUED", finished: int | None = None):
    """A device's execution row: sent at ``published`` (the send is its last update), in ``state``."""
    return replace(
        queued("a", device, 0, published_at=published, phase=phase),
        state=state,
        finished_at=finished,
        updated_at=finished or published or 0,
    )


def test_the_next_phase_waits_for_every_device_sent_its_wait_and_its_success_share():
    phases = (Phase(devices=4, wait_s=60, success_pct=50.0), Phase())
    sent = [row(f"d{i}", 1, 1_000 + i) for i in range(3)] + [row("d3", 1, None)]
    assert phase_starts(phases, sent, 0, 10**9) == [0]  # d3 not sent yet
    all_sent = [*sent[:3], row("d3", 1, 4_000)]
    assert phase_starts(phases, all_sent, 0, 10**9) == [0]  # no device succeeded
    one = [row("d0", 1, 1_000, SUCCEEDED, 9_000), row("d1", 1, 1_001, FAILED, 9_500), *all_sent[2:]]
    assert phase_starts(phases, one, 0, 10**9) == [0]  # 1 of 4 succeeded, 2 needed
    two = [row("d2", 1, 1_002, SUCCEEDED, 70_000), *one[:2], all_sent[3]]
    assert phase_starts(phases, two, 0, 10**9) == [0, 70_000]  # the second success, after the wait
    assert phase_starts(phases, two, 0, 69_999) == [0]  # not yet
    early = [row(r.device_id, 1, r.published_at, r.state, 20_000) if r.state == SUCCEEDED else r for r in two]
    assert phase_starts(phases, early, 0, 10**9) == [0, 60_000]  # successes early: the wait holds it


def test_the_next_phase_waits_for_the_sample_the_abort_rules_need_from_every_phase_so_far():
    """Phase 1 has 4 devices and the abort rules need 6 finished: the gate waits for every device sent so
    far (all 4), then phase 2's; a sample of 3 is met by phase 1's third finished device."""
    phases = (Phase(devices=4, success_pct=50.0), Phase(devices=4), Phase())
    done = [row(f"d{i}", 1, 1_000, SUCCEEDED if i < 2 else FAILED, 10_000 + i) for i in range(3)]
    running = [*done, replace(row("d3", 1, 1_000), state=IN_PROGRESS, started_at=2_000), row("e0", 2, None)]
    assert phase_starts(phases, running, 0, 10**9, Gate(sample=6)) == [0]  # 3 of the 4 sent finished
    assert phase_starts(phases, running, 0, 10**9, Gate(sample=3)) == [0, 10_002]
    finished = [*done, row("d3", 1, 1_000, SUCCEEDED, 30_000), row("e0", 2, None)]
    assert phase_starts(phases, finished, 0, 10**9, Gate(sample=6)) == [0, 30_000]  # fewer sent than 6


def test_a_device_that_never_answers_counts_as_silent_after_the_timeout():
    phases = (Phase(devices=3), Phase())
    rows = [row("d0", 1, 1_000, SUCCEEDED, 5_000), row("d1", 1, 1_000, SUCCEEDED, 6_000), row("d2", 1, 1_000)]
    gate = Gate(sample=3, silent_after_ms=60_000)
    assert phase_starts(phases, rows, 0, 60_999, gate) == [0]  # d2 may still answer
    assert phase_starts(phases, rows, 0, 61_000, gate) == [
        0,
        61_000,
    ]  # silent since 61 s: 2 of 2 is the sample
    assert phase_starts(phases, rows, 0, 10**9, Gate(sample=3)) == [0]  # no timeout: it holds the gate


def test_a_device_whose_message_expired_is_silent_with_or_without_a_timeout():
    """An EXPIRED device never had the action: it is no part of the abort rules' sample (the next phase does
    not wait for it, nor take it as finished) and cannot succeed."""
    phases = (Phase(devices=3, success_pct=60.0), Phase())
    rows = [row("d0", 1, 1_000, SUCCEEDED, 5_000), row("d1", 1, 1_000, SUCCEEDED, 6_000)]
    expired = [*rows, row("d2", 1, 1_000, EXPIRED, 90_000)]
    assert phase_starts(phases, expired, 0, 10**9, Gate(sample=3)) == [0, 90_000]  # 2 of 2 is the sample
    assert phase_starts(phases, [*rows, row("d2", 1, 1_000)], 0, 10**9, Gate(sample=3)) == [0]
    lost = (Phase(devices=3, success_pct=100.0), Phase())
    assert gate_lost(lost, expired, 0, 10**9, Gate(sample=3)) == (
        1,
        "phases[0].success_pct 100 % cannot be reached: 2 of its 3 devices succeeded and 0 may still, "
        "3 needed (1 silent)",
    )


def test_a_gate_is_lost_once_its_devices_cannot_reach_its_success_share_and_the_sample_is_in():
    phases = (Phase(devices=4, success_pct=75.0), Phase())
    rejected = [row("d0", 1, 1_000, REJECTED, 2_000), row("d1", 1, 1_000, REJECTED, 2_500)]
    running = [*rejected, row("d2", 1, 1_000), row("d3", 1, 1_000)]
    assert gate_lost(phases, running, 0, 10**9) == (
        1,
        "phases[0].success_pct 75 % cannot be reached: 0 of its 4 devices succeeded and 2 may still, "
        "3 needed",
    )
    assert gate_lost(phases, running, 0, 10**9, Gate(sample=4)) is None  # the abort rules judge first
    one_rejected = [rejected[0], *running[2:], row("d1", 1, 1_000, SUCCEEDED, 2_000)]
    assert gate_lost(phases, one_rejected, 0, 10**9) is None  # 1 + 2 may still reach 3
