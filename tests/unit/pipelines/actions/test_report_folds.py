"""A batch's reports folded per (action, device) on the executors (``reports.ReportFold``) give the row that
folding each report onto it gives (``states.apply_reports``), whatever the row: its fold where every report
is news to the row, the reports themselves (read again) where one is not."""

from __future__ import annotations

import random
from dataclasses import replace

from pipelines.actions.reports import FoldedReports, Key, fold_reports
from pipelines.actions.states import (
    ALL_STATES,
    DEVICE_REPORTED_STATES,
    IN_PROGRESS,
    QUEUED,
    SUCCEEDED,
    Execution,
    StatusReport,
    apply_reports,
    queued,
)


def _reports(rng: random.Random, action_id: str, device_id: str) -> list[StatusReport]:
    """A pair's reports of one batch, in the batch's order: repeated and out-of-order sequence numbers,
    several attempts or none said, every state a device reports."""
    states = sorted(DEVICE_REPORTED_STATES) + [IN_PROGRESS] * 4
    return [
        StatusReport(
            action_id,
            device_id,
            rng.choice(states),
            seq=rng.randint(1, 12),
            ts=rng.randint(0, 10**6),
            details=f"r{i}",
            attempt=rng.choice([None, 1, 2, 3]),
            received_at=rng.choice([None, 1000 + i]),
        )
        for i in range(rng.randint(1, 8))
    ]


def _row(rng: random.Random, action_id: str, device_id: str) -> Execution | None:
    """A row as the table may hold it, or none."""
    if rng.random() < 0.2:
        return None
    return replace(
        queued(action_id, device_id, 10, published_at=10),
        state=rng.choice(ALL_STATES),
        version=rng.randint(1, 9),
        report_seq=rng.choice([0, 0, 0, rng.randint(0, 12)]),
        attempt=rng.choice([1, 1, 2, 3]),
        started_at=rng.choice([None, 20]),
    )


def _folded(by_pair: dict[Key, list[StatusReport]], asked: list[set[Key]]) -> FoldedReports:
    def expand(keys: set[Key]) -> dict[Key, list[StatusReport]]:
        asked.append(keys)
        return {key: by_pair[key] for key in keys}

    return FoldedReports({key: fold_reports(reports) for key, reports in by_pair.items()}, expand)


def test_each_pairs_fold_gives_the_row_its_reports_give_whatever_the_row():
    rng = random.Random(20261201)
    for _ in range(300):
        by_pair = {("a", f"d{i}"): _reports(rng, "a", f"d{i}") for i in range(6)}
        rows = {"a": {d: row for (_, d) in by_pair if (row := _row(rng, "a", d)) is not None}}
        asked: list[set[Key]] = []
        folded = _folded(by_pair, asked)
        got = folded.fold(folded.by_key, rows)
        assert got == {(a, d): apply_reports(rows["a"].get(d), by_pair[(a, d)]) for a, d in by_pair}
        assert len(asked) <= 1  # the pairs read again are read in one query
        assert folded.expanded == sum(len(keys) for keys in asked)


def test_reports_that_are_all_news_to_their_rows_are_never_read_again():
    many = [StatusReport("a", "d1", IN_PROGRESS, seq, 0, f"{seq}%", 1, 100 + seq) for seq in range(1, 50)]
    by_pair: dict[Key, list[StatusReport]] = {
        ("a", "d1"): [*many, StatusReport("a", "d1", SUCCEEDED, 50, 0, "done", 1, 200)],
        ("a", "d2"): [StatusReport("a", "d2", IN_PROGRESS, 3, 0, "", None, 300)],
    }
    rows = {
        "a": {
            "d1": queued("a", "d1", 10, published_at=10),
            "d2": replace(queued("a", "d2", 10), state=QUEUED),
        }
    }
    asked: list[set[Key]] = []
    folded = _folded(by_pair, asked)
    got = folded.fold(folded.by_key, rows)
    assert asked == []
    assert got[("a", "d1")] == apply_reports(rows["a"]["d1"], by_pair[("a", "d1")])
    assert got[("a", "d1")] is not None and got[("a", "d1")].version == 51  # one version per report applied


def test_a_report_the_row_has_seen_has_only_its_pair_read_again():
    seen = [
        StatusReport("a", "d1", IN_PROGRESS, 4, 0, "again", 1, 100),
        StatusReport("a", "d1", SUCCEEDED, 5, 0, "", 1, 101),
    ]
    by_pair: dict[Key, list[StatusReport]] = {
        ("a", "d1"): seen,
        ("a", "d2"): [StatusReport("a", "d2", SUCCEEDED, 1, 0, "", 1, 100)],
    }
    rows = {
        "a": {
            "d1": replace(
                queued("a", "d1", 10, published_at=10), state=IN_PROGRESS, report_seq=4, started_at=50
            )
        }
    }
    asked: list[set[Key]] = []
    folded = _folded(by_pair, asked)
    got = folded.fold(folded.by_key, rows)
    assert asked == [{("a", "d1")}]
    assert got[("a", "d1")] == apply_reports(rows["a"]["d1"], seen)
