"""A hub whose disk fills up answers its sites, and takes their records again once space is freed: a site
dialling while the disk is full is answered ERROR saying so, where the hub's answer to its HELLO (its ends,
read once what is appended is durable) raised the store's refusal into a traceback at each dial and closed
the connection without a word.

The hub's data directory is a small tmpfs in the hub's own mount namespace (as ``test_disk_full.py``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess, free_port, wait_for_port
from broker_edge.settings.uplink import site_topic
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.refusals.test_disk_full import MOUNT_TMPFS, in_broker_namespace
from tests.e2e.uplink.uplink_harness import hub_section, pki_in, site_section

pytestmark = pytest.mark.timeout(90)


def test_a_hub_out_of_disk_space_says_so_to_each_dial_and_takes_the_records_once_space_is_freed(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = pki_in(tmp_path)
    port = free_port()
    hub = BrokerProcess(tmp_path / "hub", uplink_hub=hub_section(pki, port=port))
    data = tmp_path / "hub" / "data"
    hub.wrapper = ("unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT_TMPFS, str(data))
    hub.start()
    filler = str(data / "filler")
    try:
        wait_for_port(port)
        in_broker_namespace(hub, "dd", "if=/dev/zero", f"of={filler}", "bs=64k", "status=none")
        site = brokers("site", uplink=site_section(pki, "plant-f", port, compression="none"))
        payloads = [os.urandom(2000) for _ in range(100)]

        def send() -> None:
            for payload in payloads:
                site.broker.publish("t/f", payload, qos=1)

        site.call(send)
        said = "the hub refused: out of disk space"

        def refusals() -> int:
            return sum(said in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)

        assert wait_for(lambda: refusals() >= 3, timeout=20)  # its batch, then each HELLO after it
        text = hub.log_path.read_text()
        assert "Traceback" not in text and "HTTP request from" not in text

        in_broker_namespace(hub, "rm", "-f", filler)
        reader = OffsetsClient(hub.offsets_url)

        def held() -> int:
            logs = reader.list_logs(site_topic("plant-f", "t/f"))
            return logs[0].end_offset if logs else 0

        assert wait_for(lambda: held() == len(payloads), timeout=30)
        records = reader.fetch_records(site_topic("plant-f", "t/f"), 0, max_bytes=1 << 22).data
        assert [record.payload for record in records] == payloads
    finally:
        hub.stop()
    text = hub.log_path.read_text()
    assert "Traceback" not in text and "disk space available again" in text
