"""A hub lists the sites it admits by name from its start: a site down since the hub last started was
absent from ``timestone uplink status`` and from ``/metrics`` until it dialled again, so it could be
neither seen nor alerted on."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import hub_section, pki_in

pytestmark = pytest.mark.timeout(60)


def test_the_sites_a_hub_admits_are_listed_not_connected_before_any_dials(
    brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki_in(tmp_path), sites=["plant-1", "plant-2"]))
    url = f"http://127.0.0.1:{hub.broker.offsets_port}/v1/uplink/sites"
    with urllib.request.urlopen(url, timeout=10) as answer:
        listed = json.loads(answer.read())["sites"]
    assert [(site["site"], site["connected"], site["last_contact"]) for site in listed] == [
        ("plant-1", False, None),
        ("plant-2", False, None),
    ]
    for site in ("plant-1", "plant-2"):
        assert hub.metric("timestone_broker_uplink_site_connected", site=site) == 0
