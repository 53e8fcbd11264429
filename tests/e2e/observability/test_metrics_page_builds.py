"""Connections asking ``GET /metrics`` flat out share its pages: building them takes at most about a tenth
of the broker's loop, the devices' acknowledgements keep coming, and a page is never older than the request
it answers (``broker_edge.observe.metrics_pages``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest

from broker_edge.observe.metrics import BrokerMetrics
from broker_edge.runtime.admin_http import create_admin_app, start_admin_server
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.http_pipeliners import HttpPipeliners
from tests.e2e.observability.test_broker_observability import sample, scrape

NO_RATE_LIMITS = {"messages_per_second_per_client": 0, "new_connections_per_second": 0}
WINDOW_S = 3.0
BUILD_SECONDS = "timestone_broker_metrics_page_build_seconds_total"
PAGES_BUILT = "timestone_broker_metrics_pages_built_total"


@pytest.fixture
def pipelined(start_broker) -> Iterator[tuple[RunningBroker, HttpPipeliners]]:
    """A broker and 60 connections pipelining ``GET /metrics`` at it (its admin endpoint holds 64)."""
    broker = start_broker(limits=NO_RATE_LIMITS)
    pipeliners = HttpPipeliners(broker.broker.admin_port, connections=60).start()
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


OPENMETRICS = "application/openmetrics-text; version=1.0.0"


async def scrapes_in_both_formats(metrics: BrokerMetrics) -> list[tuple[str, str]]:
    """A scrape, then six at once in turns of text and OpenMetrics (those wait for the next build); each
    answer's (content type, body)."""
    runner, port = await start_admin_server(create_admin_app(metrics, dict), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}/metrics"

    async def scrape_as(session: aiohttp.ClientSession, accept: str) -> tuple[str, str]:
        async with session.get(url, headers={"Accept": accept}) as answer:
            assert answer.status == 200
            return answer.headers["Content-Type"], await answer.text()

    try:
        async with aiohttp.ClientSession() as session:
            await scrape_as(session, "")
            return await asyncio.gather(*(scrape_as(session, OPENMETRICS if n % 2 else "") for n in range(6)))
    finally:
        await runner.cleanup()


def test_requests_sharing_a_build_each_get_the_format_they_asked_for() -> None:
    metrics = BrokerMetrics()
    metrics.log_appends_total.inc(3)
    answers = asyncio.run(asyncio.wait_for(scrapes_in_both_formats(metrics), 20))
    for n, (content_type, body) in enumerate(answers):
        assert content_type.startswith("application/openmetrics-text" if n % 2 else "text/plain")
        assert body.endswith("# EOF\n") == bool(n % 2)
        assert "timestone_broker_log_appends_total 3.0" in body
