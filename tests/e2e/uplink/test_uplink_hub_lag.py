"""The hub's lag in seconds for a site whose topics are new to it: a topic the hub holds nothing of counts
as old as its oldest record on the site, where it counted 0 (the hub measured the site's newest record
against its own newest of the topic, and had none), so a site far behind on new topics looked current."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.test_uplink_many_topics import fill_site
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, pki_in, site_section

pytestmark = pytest.mark.timeout(60)

BACKLOG_AGE_S = 600


def test_a_topic_the_hub_holds_nothing_of_lags_by_the_age_of_its_oldest_record(
    brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    hub = brokers("hub", storage={"max_topics": 2}, uplink_hub=hub_section(pki))
    hub.call(partial(hub.broker.publish, "hub/own", b"1", qos=1))  # room left for one of the site's topics
    fill_site(tmp_path / "site", 2, int(time.time() * 1000) - BACKLOG_AGE_S * 1000)
    brokers("site", uplink=site_section(pki, "plant-l", hub_port(hub), batch_bytes=1))
    metric = partial(hub.metric, site="plant-l")
    assert wait_for(lambda: metric("timestone_broker_uplink_site_received_records") == 1, 20)
    assert wait_for(lambda: metric("timestone_broker_uplink_site_lag_records") == 1, 20)
    assert BACKLOG_AGE_S <= metric("timestone_broker_uplink_site_lag_seconds") < BACKLOG_AGE_S + 60
