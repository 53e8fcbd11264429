"""Retrying an etcd that does not answer: waits that grow to a cap, spread by jitter, and one log line per
change of state (failing, answering again), not one per attempt."""

from __future__ import annotations

import logging

from broker_edge.cluster.coordination.backoff import Backoff

log = logging.getLogger("test.backoff")


def test_waits_double_up_to_the_cap_at_most():
    backoff = Backoff("reading the cluster state", log, first_s=0.2, cap_s=10.0, random_fraction=lambda: 1.0)
    waits = [backoff.failed("connection refused") for _ in range(9)]
    assert waits == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0]


def test_jitter_spreads_the_waits_below_the_bound_and_never_to_zero():
    fractions = iter([0.5, 0.0, 0.25])
    backoff = Backoff("x", log, first_s=0.2, cap_s=10.0, random_fraction=lambda: next(fractions))
    assert [backoff.failed("down") for _ in range(3)] == [0.1, 0.02, 0.2]


def test_one_warning_per_outage_and_one_line_when_it_ends(caplog):
    caplog.set_level(logging.DEBUG, logger="test.backoff")
    backoff = Backoff("reading the cluster state", log)
    for _ in range(50):
        backoff.failed("connection refused")
    backoff.succeeded()
    backoff.succeeded()
    levels = [
        (r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records if r.levelno >= logging.INFO
    ]
    assert levels == [
        ("WARNING", "reading the cluster state failed, retrying with backoff"),
        ("INFO", "reading the cluster state works again"),
    ]
    assert "after 50 failed attempts" in caplog.records[-1].getMessage()
    assert backoff.failed("again") < 0.2 + 1e-9  # a new outage starts from the first wait
