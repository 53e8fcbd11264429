"""A site whose batches the hub refuses (here: the hub keeps at most ``storage.max_topics`` logs and the site
has a topic per device past it) dials again with its backoff growing, as after any failed dial: the link
had reached the hub, so each refusal set the wait back to ``reconnect_min_s`` and the site dialled twice a
second for as long as the refusal lasted, each time a HELLO answered with the ends of all its logs and a
WARNING on both ends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess, free_port
from tests.e2e.broker_clients import wait_for
from tests.e2e.uplink.test_uplink_many_topics import fill_site
from tests.e2e.uplink.uplink_harness import hub_section, pki_in, site_section

pytestmark = pytest.mark.timeout(60)

REFUSED = "the hub refused: cannot create a log for"


def test_a_site_the_hub_keeps_refusing_backs_off_between_its_dials(tmp_path: Path) -> None:
    pki = pki_in(tmp_path)
    port = free_port()
    hub = BrokerProcess(
        tmp_path / "hub",
        dies_with_parent=True,
        storage={"max_topics": 1000},
        uplink_hub=hub_section(pki, port=port),
    ).start()
    fill_site(tmp_path / "site" / "data", 2000, int(time.time() * 1000))
    section = site_section(pki, "plant-r", port, reconnect_min_s=0.5, reconnect_max_s=30.0)
    site = BrokerProcess(tmp_path / "site", dies_with_parent=True, uplink=section).start()

    def refusals() -> int:
        return site.log_path.read_text().count(REFUSED)

    try:
        assert wait_for(lambda: refusals() >= 1, timeout=20)
        first = time.monotonic()
        time.sleep(6.0)  # with its backoff: 0.5 + 1 + 2 s, then 4 s; without it, every 0.5 s
        seen = refusals()
        elapsed = time.monotonic() - first
    finally:
        site.stop()
        hub.stop()
    assert 2 <= seen <= 5, f"{seen} refusals in {elapsed:.1f} s"
    assert "the broker keeps at most 1000 logs" in site.log_path.read_text()


def test_the_wait_said_after_a_link_that_worked_is_the_one_waited(tmp_path: Path) -> None:
    """After dials that failed (the wait grown to 4 s), a link that worked and ended sets the wait back to
    ``reconnect_min_s``: the line saying the end said the grown wait ('again in 4.0 s') and the site dialled
    0.5 s later."""
    pki = pki_in(tmp_path)
    port = free_port()
    section = site_section(pki, "plant-w", port, reconnect_min_s=0.5, reconnect_max_s=4.0)
    site = BrokerProcess(tmp_path / "site", dies_with_parent=True, uplink=section).start()
    hub = BrokerProcess(tmp_path / "hub", dies_with_parent=True, uplink_hub=hub_section(pki, port=port))
    try:
        assert wait_for(lambda: "again in 4.0 s" in site.log_path.read_text(), timeout=20)  # no hub yet
        hub.start()
        assert wait_for(lambda: "uplink: connected to" in site.log_path.read_text(), timeout=20)
        connected = site.log_path.read_text().count("uplink: connected to")
        hub.stop()
        assert wait_for(lambda: "again in" in site.log_path.read_text().split("uplink: connected to")[-1])
        said = site.log_path.read_text().split("uplink: connected to")[-1]
        assert "again in 0.5 s" in said and "again in 4.0 s" not in said, said
        assert connected == 1
    finally:
        site.stop()
        hub.stop()
