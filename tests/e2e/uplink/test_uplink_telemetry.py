"""The telemetry job, unchanged, reading every site from the hub (``source.options.sites``): bronze holds
each site's records once, under the site's name, at the site's offsets. (Runs continuing a checkpoint as
sites join are the source's test, ``test_uplink_spark.py``.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.telemetry.config import load_telemetry_config
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.telemetry.telemetry_harness import reading, run_available_now
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, mirrored, pki_in, site_section

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

Key = tuple[str, str, int]


def publish_and_mirror(site: RunningBroker, hub: RunningBroker, site_id: str, first_seq: int) -> list[Key]:
    """Two devices' readings published on the site and mirrored to the hub; their (site, topic, offset)."""
    topics = [f"devices/{site_id}-d{n}/telemetry" for n in range(2)]

    def publish() -> None:
        for seq in range(first_seq, first_seq + 3):
            for n, topic in enumerate(topics):
                site.broker.publish(topic, reading(f"{site_id}-d{n}", seq, seq), qos=1)

    site.call(publish)
    site_store, hub_store = site.broker.store, hub.broker.store
    assert site_store is not None and hub_store is not None
    total = 2 * (first_seq + 2)
    assert wait_for(
        lambda: hub.call(lambda: site.call(lambda: mirrored(site_store, hub_store, site_id, topics, total))),
        timeout=20,
    )
    return [(site_id, topic, offset) for topic in topics for offset in range(first_seq - 1, first_seq + 2)]


def run_job(spark: SparkSession, hub: RunningBroker, tmp_path: Path) -> list[Key]:
    config = load_telemetry_config(
        {
            "source": {
                "brokers": [f"hub=http://127.0.0.1:{hub.broker.offsets_port}"],
                "starting_offsets": "earliest",
                "options": {"sites": "true", "fetchTimeoutMs": "30000", "fetchRetries": "6"},
            },
            "tables": {"root": str(tmp_path / "tables")},
            "stream": {"checkpoint": str(tmp_path / "checkpoint")},
            "quality": {"gx": {"schedule": "never"}},
        }
    )
    batch = run_available_now(spark, config, 240)
    rows = batch.store.read("bronze_telemetry").select("broker", "topic", "offset").collect()
    return sorted((row.broker, row.topic, row.offset) for row in rows)


def test_the_telemetry_job_reads_each_sites_records_once_from_the_hub(
    spark: SparkSession, brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    sites = {
        name: brokers(name, uplink=site_section(pki, name, hub_port(hub))) for name in ("plant-a", "plant-b")
    }
    keys = [key for name, site in sites.items() for key in publish_and_mirror(site, hub, name, 1)]
    assert run_job(spark, hub, tmp_path) == sorted(keys)  # each once: bronze's key is (broker, topic, offset)
