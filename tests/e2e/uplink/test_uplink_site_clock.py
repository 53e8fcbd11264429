"""A site whose clock is days behind the hub's: its records carry its time, byte for byte, and the hub's
retention judges them by it, so every record it sent was deleted on the hub at the next retention pass
after its segment was sealed, while both ends' status said nothing was lagging or lost. The hub now says,
at WARNING, which site's records arrive past its retention and how old they are."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess, free_port
from tests.e2e.broker_clients import wait_for
from tests.e2e.uplink.test_uplink_many_topics import fill_site
from tests.e2e.uplink.uplink_harness import hub_section, pki_in, site_section

pytestmark = pytest.mark.timeout(60)

DAY_MS = 86_400_000


def test_records_of_a_site_whose_clock_is_days_behind_are_said_to_arrive_past_the_hubs_retention(
    tmp_path: Path,
) -> None:
    pki = pki_in(tmp_path)
    port = free_port()
    hub = BrokerProcess(tmp_path / "hub", dies_with_parent=True, uplink_hub=hub_section(pki, port=port))
    hub.start()
    behind_ms = int(time.time() * 1000) - 8 * DAY_MS  # what a site whose clock is 8 days behind writes
    fill_site(tmp_path / "site" / "data", 2000, behind_ms)
    site = BrokerProcess(tmp_path / "site", dies_with_parent=True, uplink=site_section(pki, "plant-s", port))
    site.start()
    said = re.compile(r"site plant-s: \d+ records of \d+ topics arrive past this hub's retention")

    def warned() -> bool:
        return said.search(hub.log_path.read_text()) is not None

    try:
        assert wait_for(warned, timeout=20), hub.log_path.read_text()[-2000:]
    finally:
        site.stop()
        hub.stop()
    line = next(line for line in hub.log_path.read_text().splitlines() if said.search(line))
    assert "WARNING" in line
    assert "'site/dev-00000/temp'" in line and "8.0 days old" in line and "7.0 days" in line
    assert "clock" in line
