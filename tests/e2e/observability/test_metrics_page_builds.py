"""Connections asking ``GET /metrics`` flat out share its pages: building them takes at most about a tenth
of the broker's loop, the devices' acknowledgements keep coming, and a page is never older than the request
it answers (``broker_edge.observe.metrics_pages``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.observability.metrics_pipeliners import MetricsPipeliners
from tests.e2e.observability.test_broker_observability import sample, scrape

NO_RATE_LIMITS = {"messages_per_second_per_client": 0, "new_connections_per_second": 0}
WINDOW_S = 3.0
BUILD_SECONDS = "timestone_broker_metrics_page_build_seconds_total"
PAGES_BUILT = "timestone_broker_metrics_pages_built_total"


@pytest.fixture
def pipelined(start_broker) -> Iterator[tuple[RunningBroker, MetricsPipeliners]]:
    """A broker and 60 connections pipelining ``GET /metrics`` at it (its admin endpoint holds 64)."""
    broker = start_broker(limits=NO_RATE_LIMITS)
    pipeliners = MetricsPipeliners(broker.broker.admin_port, connections=60).start()
    try:
        assert wait_for(lambda: pipeliners.answers >= 600, timeout=30)
        yield broker, pipeliners
    finally:
        pipeliners.stop()
    assert pipeliners.failures == []


def test_pipelined_scrapes_share_pages_built_in_a_tenth_of_the_loop_while_a_publisher_is_acknowledged(
    pipelined,
):
    broker, pipeliners = pipelined
    publisher = PahoClient(broker.port, "device")
    seconds_before, pages_before = broker.metric(BUILD_SECONDS), broker.metric(PAGES_BUILT)
    answers_before = pipeliners.answers
    began = time.monotonic()
    acknowledged = 0
    while time.monotonic() - began < WINDOW_S:
        publisher.publish("devices/1/telemetry", b"21.5", qos=1)  # waits for its PUBACK, asserts it
        acknowledged += 1
    window = time.monotonic() - began
    building = broker.metric(BUILD_SECONDS) - seconds_before
    pages = broker.metric(PAGES_BUILT) - pages_before
    answers = pipeliners.answers - answers_before
    # Each build is followed by nine times its time without one: a tenth of the window, and the last build.
    assert building <= 0.25 * window, f"{building:.2f} s of {window:.2f} s spent building pages"
    assert answers > 2 * pages > 0  # pages are shared, and the scrapers are answered all along
    assert acknowledged >= 20


def test_a_scrape_right_after_a_publish_counts_it_while_pages_are_built_flat_out(pipelined):
    broker, _ = pipelined
    publisher = PahoClient(broker.port, "device")
    for sent in range(1, 21):
        publisher.publish("devices/1/telemetry", b"21.5", qos=1)  # acknowledged: counted by the broker
        received = sample(scrape(broker), "timestone_broker_messages_received_total", listener="tcp", qos="1")
        assert received == sent
