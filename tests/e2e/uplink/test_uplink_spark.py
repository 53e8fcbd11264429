"""The ``timestone`` source pointed at a hub reads each site's topics as that site's, at the site's offsets,
each record once, with sites joining between batches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.spark_reads import Row, read_sites
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, mirrored, pki_in, site_section

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


def start_site(
    brokers: Callable[..., RunningBroker], hub: RunningBroker, pki_dir: Path, site_id: str
) -> RunningBroker:
    site = brokers(site_id, uplink=site_section(pki_in(pki_dir), site_id, hub_port(hub)))

    def publish() -> None:
        for n in range(5):
            site.broker.publish("plant/line-1/temp", f"{site_id} {n}".encode(), qos=1)
        site.broker.publish("plant/line-2/temp", f"{site_id} only".encode(), qos=1)

    site.call(publish)
    site_store, hub_store = site.broker.store, hub.broker.store
    assert site_store is not None and hub_store is not None
    topics = ["plant/line-1/temp", "plant/line-2/temp"]
    assert wait_for(
        lambda: hub.call(lambda: site.call(lambda: mirrored(site_store, hub_store, site_id, topics, 6))),
        timeout=20,
    )
    return site


def read_hub(spark: SparkSession, hub: RunningBroker, checkpoint: Path) -> list[Row]:
    return read_sites(spark, checkpoint, {"brokers": f"hub=http://127.0.0.1:{hub.broker.offsets_port}"})


def site_rows(site_id: str) -> list[Row]:
    line_1 = [(site_id, "plant/line-1/temp", n, f"{site_id} {n}".encode()) for n in range(5)]
    return [*line_1, (site_id, "plant/line-2/temp", 0, f"{site_id} only".encode())]


def test_the_source_reads_every_site_from_the_hub_as_its_own_broker(
    timestone_spark: SparkSession, brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki_in(tmp_path)))
    start_site(brokers, hub, tmp_path, "plant-a")
    start_site(brokers, hub, tmp_path, "plant-b")
    checkpoint = tmp_path / "checkpoint"

    assert read_hub(timestone_spark, hub, checkpoint) == site_rows("plant-a") + site_rows("plant-b")

    start_site(brokers, hub, tmp_path, "plant-c")  # joins: read from its first record, nothing again
    assert read_hub(timestone_spark, hub, checkpoint) == site_rows("plant-c")
