"""A hub lists the sites it admits by name from its start, and a hub admitting any site those it holds logs
of: a site down since the hub last started was absent from ``timestone uplink status`` and from
``/metrics`` until it dialled again, so it could be neither seen nor alerted on."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, pki_in, site_section

pytestmark = pytest.mark.timeout(60)


def test_the_sites_a_hub_admits_are_listed_not_connected_before_any_dials(
    brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki_in(tmp_path), sites=["plant-1", "plant-2"]))
    assert [(site["site"], site["connected"], site["last_contact"]) for site in listed(hub)] == [
        ("plant-1", False, None),
        ("plant-2", False, None),
    ]
    for site in ("plant-1", "plant-2"):
        assert hub.metric("timestone_broker_uplink_site_connected", site=site) == 0


def test_a_hub_admitting_any_site_lists_those_it_holds_logs_of_after_a_restart(
    brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    site = brokers("site", uplink=site_section(pki, "plant-7", hub_port(hub)))
    site.call(lambda: site.broker.publish("line/1/temp", b"21.5", qos=1))
    assert wait_for(lambda: [s["received_records"] for s in listed(hub)] == [1])
    site.stop()
    hub.stop()

    hub = brokers("hub", uplink_hub=hub_section(pki))
    assert [(s["site"], s["connected"], s["topics"]) for s in listed(hub)] == [("plant-7", False, 1)]
    assert hub.metric("timestone_broker_uplink_site_connected", site="plant-7") == 0


def listed(hub: RunningBroker) -> list[dict]:
    """The sites ``hub`` lists at ``/v1/uplink/sites`` (``timestone uplink status``)."""
    url = f"http://127.0.0.1:{hub.broker.offsets_port}/v1/uplink/sites"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())["sites"]
