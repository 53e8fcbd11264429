"""A site whose retention deletes records its uplink has not sent yet (the link is down): a WARNING and a
metric come before the deletion; after the link is back, the hub records the gap explicitly, keeps the
records it held before it and goes on at the site's offsets; the Spark source on the hub fails on the gap
with failOnDataLoss=true and skips exactly the gap with false."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from broker_edge.settings.uplink import site_topic
from broker_edge.storage import CorruptRecord
from broker_edge.uplink.hub import GAPS_FILE
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.sources.test_timestone_source_spark import run_available_now
from tests.e2e.uplink.uplink_harness import WanRelay, hub_port, hub_section, log_frames, pki_in, site_section

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

TOPIC = "telemetry/a"
HUB_TOPIC = site_topic("plant-g", TOPIC)


def publish(site: RunningBroker, first: int, count: int) -> None:
    """Records ``first``.. of ``TOPIC``, at QoS 1 through the broker's own path, in one append."""

    def send() -> None:
        for n in range(first, first + count):
            site.broker.publish(TOPIC, f"r{n}".encode().ljust(100), qos=1)

    site.call(send)


def read_hub(spark: SparkSession, hub: RunningBroker, checkpoint: Path, fail_on_data_loss: str) -> list[int]:
    offsets: list[int] = []

    def collect(frame: DataFrame, _batch_id: int) -> None:
        offsets.extend(row.offset for row in frame.select("offset").collect())

    from sources import register_sources

    register_sources(spark)
    frame = (
        spark.readStream.format("timestone")
        .option("brokers", f"hub=http://127.0.0.1:{hub.broker.offsets_port}")
        .option("topics", TOPIC)
        .option("sites", "true")
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", fail_on_data_loss)
        .load()
    )
    run_available_now(frame, checkpoint, collect)
    return sorted(offsets)


@contextlib.contextmanager
def site_behind_a_wan(
    brokers: Callable[..., RunningBroker], tmp_path: Path, retention_ms: int, **uplink: Any
) -> Iterator[tuple[RunningBroker, RunningBroker, WanRelay]]:
    """A hub, and site ``plant-g`` reaching it through a relay the test cuts, with a short retention
    (``retention_ms``) and ``uplink``'s settings; yielded once the hub holds its first 10 records of
    ``TOPIC``."""
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    wan = WanRelay(hub_port(hub))
    try:
        storage = {"retention_ms": retention_ms, "retention_interval_s": 0.2, "segment_bytes": 1024}
        site = brokers("site", storage=storage, uplink=site_section(pki, "plant-g", wan.port, **uplink))
        hub_store = hub.broker.store
        assert hub_store is not None
        publish(site, 0, 10)
        assert wait_for(lambda: hub.call(lambda: hub_store.durable_end(HUB_TOPIC)) == 10, timeout=20)
        yield hub, site, wan
    finally:
        wan.close()


def test_a_sites_retention_gap_is_warned_before_recorded_on_the_hub_and_read_as_data_loss(
    spark: SparkSession,
    brokers: Callable[..., RunningBroker],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with site_behind_a_wan(brokers, tmp_path, 3000, retention_warning_ratio=0.3) as (hub, site, wan):
        site_store, hub_store = site.broker.store, hub.broker.store
        assert site_store is not None and hub_store is not None
        before_gap = hub.call(lambda: log_frames(hub_store, HUB_TOPIC))

        wan.cut(down=True)  # the WAN is down: records 10..29 wait on the site
        publish(site, 10, 20)
        site.call(lambda: site.broker.publish("telemetry/b", b"x" * 1024, qos=1))  # rolls 10..29's segment
        assert wait_for(lambda: site.metric("timestone_broker_uplink_unsent_at_risk_records") > 0, timeout=10)
        assert site.call(lambda: site_store.start_offset(TOPIC)) <= 10  # warned before any was deleted
        assert "not yet sent are" in caplog.text
        assert wait_for(lambda: site.call(lambda: site_store.start_offset(TOPIC)) == 30, timeout=15)
        publish(site, 30, 10)
        wan.heal()

        assert wait_for(lambda: hub.call(lambda: hub_store.durable_end(HUB_TOPIC)) == 40, timeout=20)
        lost_end = site.call(lambda: site_store.start_offset(TOPIC))
        # the gap is journalled once its batch is acknowledged, on the hub's loop: read there, once it is
        journal = Path(hub_store.layout.meta) / GAPS_FILE
        assert wait_for(lambda: hub.call(journal.exists), timeout=10)
        gaps = hub.call(journal.read_text).splitlines()
        expected = {"site": "plant-g", "topic": TOPIC, "start": 10, "end": lost_end}
        assert [json.loads(line) for line in gaps] == [expected]
        assert hub.metric("timestone_broker_uplink_site_gap_records", site="plant-g") == lost_end - 10
        assert site.metric("timestone_broker_uplink_gap_records") == lost_end - 10
        assert "never reached the hub" in caplog.text
        start, end, held = hub.call(lambda: log_frames(hub_store, HUB_TOPIC))
        assert (start, end, held) == (0, 40, before_gap[2])  # what the hub held before the gap stays
        with pytest.raises(CorruptRecord) as lost:
            hub.call(lambda: hub_store.read(HUB_TOPIC, 10))
        assert lost.value.next_offset == lost_end
        after = hub.call(lambda: hub_store.replicated_log.read_frames(HUB_TOPIC, lost_end, 1 << 20))
        assert after == site.call(lambda: site_store.replicated_log.read_frames(TOPIC, lost_end, 1 << 20))

    checkpoint = tmp_path / "checkpoint"
    with pytest.raises(StreamingQueryException) as caught:
        read_hub(spark, hub, checkpoint, "true")
    assert "data loss on broker 'hub'" in str(caught.value) and f"[10, {lost_end})" in str(caught.value)
    assert read_hub(spark, hub, checkpoint, "false") == [*range(10), *range(lost_end, 40)]
