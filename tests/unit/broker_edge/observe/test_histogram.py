"""A fixed-bucket histogram: where an observation falls, and its exposition as Prometheus reads it."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker_edge.observe.histogram import COMMIT_SECONDS, Histogram
from broker_edge.observe.metrics import BrokerMetrics


def test_an_observation_on_a_bound_counts_in_that_bucket_and_one_above_every_bound_in_the_last():
    histogram = Histogram((0.001, 0.01, 0.1))
    for value in (0.0, 0.001, 0.0011, 0.01, 0.5, 7.0):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 0, 2]
    assert histogram.count == 6
    assert histogram.sum == pytest.approx(7.5121)
    assert histogram.cumulative() == [("0.001", 2), ("0.01", 4), ("0.1", 4), ("+Inf", 6)]


@pytest.mark.parametrize("bounds", [(), (0.1, 0.01), (0.1, 0.1)])
def test_bounds_that_are_not_increasing_are_refused(bounds):
    with pytest.raises(ValueError, match="increasing and distinct"):
        Histogram(bounds)


def test_the_exposition_has_cumulative_buckets_a_count_and_a_sum():
    metrics = BrokerMetrics()
    histogram = Histogram(COMMIT_SECONDS)
    metrics.histogram("log_commit_seconds", "Seconds of each commit.", histogram)
    for value in (0.0002, 0.0003, 0.004, 0.2, 9.0):
        histogram.observe(value)
    text = generate_latest(metrics.registry).decode()
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "timestone_broker_log_commit_seconds"
    ]
    assert family.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    name = "timestone_broker_log_commit_seconds"
    assert samples[(name + "_bucket", "0.0005")] == 2
    assert samples[(name + "_bucket", "0.005")] == 3
    assert samples[(name + "_bucket", "0.25")] == 4
    assert samples[(name + "_bucket", "5.0")] == 4
    assert samples[(name + "_bucket", "+Inf")] == 5
    assert samples[(name + "_count", None)] == 5
    assert samples[(name + "_sum", None)] == pytest.approx(9.2045)
    buckets = [s.value for s in family.samples if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets) and len(buckets) == len(COMMIT_SECONDS) + 1
