"""A gap in a site's log that cannot travel yet (retention deleted every unsent record and nothing came
after: a gap travels with the next record) is said and counted once, where the site said it again at each
report of its ends and counted it each time (``uplink_gap_records`` 525 for a gap of 25 records)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.test_uplink_gap import HUB_TOPIC, TOPIC, publish, site_behind_a_wan

pytestmark = pytest.mark.timeout(90)

SAID = "are gone before they were sent"


def test_a_gap_waiting_for_a_record_to_travel_with_is_said_and_counted_once(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with site_behind_a_wan(brokers, tmp_path, 2000, heartbeat_s=0.2) as (hub, site, wan):
        site_store, hub_store = site.broker.store, hub.broker.store
        assert site_store is not None and hub_store is not None

        wan.cut(down=True)
        publish(site, 10, 20)
        site.call(lambda: site.broker.publish("telemetry/b", b"x" * 1024, qos=1))  # rolls 10..29's segment
        assert wait_for(lambda: site.call(lambda: site_store.start_offset(TOPIC)) == 30, timeout=15)
        assert site.call(lambda: site_store.committed_end(TOPIC)) == 30  # nothing left after the gap
        wan.heal()

        assert wait_for(lambda: site.metric("timestone_broker_uplink_gap_records") > 0, timeout=20)
        time.sleep(2.0)  # ten reports of the site's ends: each built the batch again
        assert site.metric("timestone_broker_uplink_gap_records") == 20
        assert caplog.text.count(SAID) == 1

        publish(site, 30, 5)  # the gap travels with the next record, the hub records it once
        assert wait_for(lambda: hub.call(lambda: hub_store.durable_end(HUB_TOPIC)) == 35, timeout=20)
        assert hub.metric("timestone_broker_uplink_site_gap_records", site="plant-g") == 20
        assert site.metric("timestone_broker_uplink_gap_records") == 20
        assert caplog.text.count(SAID) == 1
