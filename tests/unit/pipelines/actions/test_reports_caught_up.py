"""When the actions job's reports stream has caught up: a batch that read up to the latest offsets its
``timestone`` source reported. That source ends a batch with keys the latest offsets do not hold (its stores,
listed filters, partition marks), so an equality test never held: a job with reports coming in all the time
(the demo's devices) was never caught up, and its ticker, which sends nothing before, held every rollout."""

from __future__ import annotations

import json

from pipelines.actions.reports import _caught_up_at

LATEST = {"edge": {"devices/d1/ota/report": 7, "devices/d2/ota/report": 3}}
TIMESTAMP = "2026-12-01T11:35:00.000Z"
BEGAN_MS = 1_796_124_900_000


def progress(latest: object, end: object) -> dict:
    return {"timestamp": TIMESTAMP, "sources": [{"latestOffset": latest, "endOffset": end}]}


def test_a_batch_that_read_every_log_to_the_latest_offsets_is_caught_up_whatever_else_its_end_holds():
    end = {"edge": {**LATEST["edge"], "~store": 12, "~listed/devices/+/ota/report": 1}}
    assert _caught_up_at(progress(LATEST, end)) == BEGAN_MS
    assert _caught_up_at(progress(json.dumps(LATEST), json.dumps(end))) == BEGAN_MS  # as JSON text


def test_a_batch_short_of_one_log_or_missing_it_is_not_caught_up():
    short = {"edge": {"devices/d1/ota/report": 6, "devices/d2/ota/report": 3}}
    missing = {"edge": {"devices/d1/ota/report": 7}}
    other_broker = {"hub": LATEST["edge"]}
    for end in (short, missing, other_broker):
        assert _caught_up_at(progress(LATEST, end)) is None, end
    assert _caught_up_at(progress(None, LATEST)) is None  # a source that reports no latest offsets
