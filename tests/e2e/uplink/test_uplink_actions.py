"""The actions job, pointed at a hub (``sites: true``), rolls an OTA out to a site's devices: the row
written in the cloud is fanned out through the hub, downlinked to the site, taken by devices on the site's
broker; their reports go back up the uplink and every execution reaches ``SUCCEEDED`` in Delta. The hub is a
broker alone, or a cluster of three with two replicas a partition (``cluster: true``: the job publishes
through any member and reads every site's reports from their partitions' leaders)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from broker_edge.config.endpoints import BrokerEndpoint
from broker_edge.settings.uplink import site_topic
from pipelines.actions.config import ActionsConfig
from pipelines.actions.job import start_actions_job
from pipelines.actions.operator import NewAction, create_action
from pipelines.fleet.fleet import FleetSpec
from sinks import open_table_store
from tests.e2e.conftest import RunningBroker
from tests.e2e.ota.conftest import SHA256, register_devices, summary, wait_for
from tests.e2e.uplink.cluster_hub_harness import NODES, hub_cluster, hub_url, member_store
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, pki_in, site_section
from tests.fleet_harness import FleetHarness, quiet_devices

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

DEVICES = 6


def roll_out(
    spark: SparkSession, tmp_path: Path, site: RunningBroker, hub: list[BrokerEndpoint], cluster: bool
) -> None:
    """An OTA row for the site's six devices, fanned out by the actions job through ``hub``: every
    execution ``SUCCEEDED``, every device on the new firmware."""
    store = open_table_store(spark, str(tmp_path / "tables"), backend="delta-rs")
    spec = FleetSpec(brokers=[("127.0.0.1", site.port)], count=DEVICES, groups=["line-1"], buckets=4)
    with FleetHarness(("127.0.0.1", site.port), spec, quiet_devices()) as harness:
        fleet = harness.fleet
        register_devices(store, {d.device_id: d.group for d in fleet.devices})
        config = ActionsConfig(
            tables_root=str(tmp_path / "tables"),
            checkpoint_root=str(tmp_path / "checkpoints"),
            brokers=hub,
            cluster=cluster,
            sites=True,
            trigger_interval_s=0.5,
            tick_interval_s=0.5,
            device_buckets=spec.buckets,
        )
        job = start_actions_job(spark, config, store)
        try:
            action_id = create_action(
                store,
                NewAction(
                    group="line-1", version="2.0.0", url="https://example.invalid/fw.bin", sha256=SHA256
                ),
            )
            wait_for(
                lambda: (s := summary(store, action_id)) is not None and s["action_state"] == "COMPLETED",
                timeout_s=120,
                what="the action to complete through the hub",
            )
        finally:
            job.stop()
    executions = store.read_arrow("action_executions")
    executions = executions.filter(pc.equal(executions["action_id"], action_id))
    states = dict(zip(executions["device_id"].to_pylist(), executions["state"].to_pylist(), strict=True))
    assert states == {d.device_id: "SUCCEEDED" for d in fleet.devices}
    assert {d.firmware for d in fleet.devices} == {"2.0.0"}
    done = summary(store, action_id)
    assert done is not None and done["succeeded_count"] == DEVICES


def test_an_ota_row_fanned_out_through_the_hub_succeeds_on_a_sites_devices(
    spark: SparkSession, brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    site = brokers("site", uplink=site_section(pki, "plant-ota", hub_port(hub)))
    endpoint = BrokerEndpoint(mqtt_port=hub.port, offsets_api=f"http://127.0.0.1:{hub.broker.offsets_port}")
    roll_out(spark, tmp_path, site, [endpoint], cluster=False)
    hub_store = hub.broker.store
    assert hub_store is not None
    reports = hub.call(
        lambda: [info.topic for info in hub_store.logs(site_topic("plant-ota", "actions/reports/+"))]
    )
    assert reports  # the devices' reports came up the uplink, under the site's namespace
    assert (
        hub.call(lambda: hub_store.logs("actions/reports/+")) == []
    )  # none were published on the hub itself


def test_an_ota_row_fanned_out_through_a_cluster_hub_succeeds_on_a_sites_devices(
    spark: SparkSession, brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    etcd, _target, ports, hubs = hub_cluster(tmp_path, pki, replication_factor=2, min_insync_replicas=1)
    try:
        uplink = site_section(pki, "plant-ota", ports[NODES[0]])
        uplink["hubs"] = [hub_url(ports[node]) for node in NODES]
        site = brokers("site", uplink=uplink)
        members = [
            BrokerEndpoint(name=node, mqtt_port=hubs[node].port, offsets_api=hubs[node].offsets_url)
            for node in NODES
        ]
        roll_out(spark, tmp_path, site, members, cluster=True)
        for hub in hubs.values():
            hub.stop()
    finally:
        for hub in hubs.values():
            hub.kill()
        etcd.kill()
    reports: set[str] = set()
    for node in NODES:
        with member_store(tmp_path, node) as store:
            reports.update(info.topic for info in store.logs(site_topic("plant-ota", "actions/reports/+")))
            assert store.logs("actions/reports/+") == [], node  # none were published on the hub itself
    assert reports  # the devices' reports came up the uplink, under the site's namespace
