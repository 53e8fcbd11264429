"""OTA on a cluster: a rollout to a fleet spread over three brokers survives the SIGKILL of the broker the
actions job publishes through, while its reports query reads the cluster from whichever replicas live.

Three broker processes on a real etcd, the actions job on the test session's local SparkSession, real Delta
tables, and simulated devices spread evenly over the brokers (each moves to the next broker when its own
stops accepting it), in processes of their own as ``timestone devices simulate --procs`` runs them (a
thousand sockets in the test's process would also break the select() of Spark's callback server). The job
finds by itself that its brokers form a cluster. A broadcast goes out first, then a paced rollout; while the
rollout runs, the broker the job uses is killed. Every device ends in a final state in
``action_executions``, matching what the device itself did; the broadcast is in the survivors' logs once
(not once per broker); the rollout's messages were each published once, but for resends of ones the killed
broker never acknowledged; and no device acted twice on an action.
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.compute as pc
import pytest

from broker_edge.config import ConfigError
from broker_edge.runtime.launcher import BrokerProcess, free_port
from pipelines.actions.buckets import DEFAULT_BUCKETS, bucket_of, bucket_topic
from pipelines.actions.cluster import BrokerKind, brokers_form_a_cluster, live_endpoints, probe
from pipelines.actions.config import ActionsConfig, BrokerEndpoint
from pipelines.actions.job import start_actions_job
from pipelines.actions.operator import NewAction, create_action
from pipelines.actions.publisher import ClusterPublisher
from pipelines.actions.reports import ClusterReports
from pipelines.actions.states import TERMINAL_STATES
from pipelines.fleet.fleet import FleetSpec
from pipelines.fleet.processes import DeviceTimes, FleetProcesses
from pipelines.preflight import BrokersUnreachable
from sinks import open_table_store
from tests.e2e.cluster.proof import read_log, wait_settled, wait_until
from tests.e2e.ota.conftest import SHA256, register_devices, summary
from tests.fleet_harness import quiet_devices

pytestmark = pytest.mark.spark

NODES = ("a", "b", "c")
DEVICES = 1000
RATE_PER_MINUTE = 6000
"""The paced rollout reaches 100 devices a second: the kill lands in its middle."""
ROLLOUT_S = 120.0


def _endpoint(node: str, broker: BrokerProcess) -> BrokerEndpoint:
    return BrokerEndpoint(node, broker.offsets_url, mqtt_port=broker.port)


def _states(store, action_id: str) -> dict[str, str]:
    table = store.read_arrow("action_executions")
    table = table.filter(pc.equal(table["action_id"], action_id))
    return dict(zip(table["device_id"].to_pylist(), table["state"].to_pylist(), strict=True))


def _reached(fleet: FleetProcesses, action_id: str) -> int:
    """Devices that have the action (in any state)."""
    return sum(1 for times in fleet.times(action_id) if times.state is not None)


def _completed(store, action_id: str) -> bool:
    row = summary(store, action_id)
    return row is not None and row["action_state"] == "COMPLETED"


@pytest.fixture
def own_streams(spark):
    """The test's Spark session; every streaming query the test started and left running (a failure before
    the job's own stop, or in it) is stopped at its end, so none of them outlives it into later tests."""
    before = {query.id for query in spark.streams.active}
    yield spark
    left = [query for query in spark.streams.active if query.id not in before]
    for query in left:
        query.stop()
    assert not left, f"streaming queries left running: {[query.name for query in left]}"


def test_rollout_survives_the_kill_of_the_broker_the_job_uses(tmp_path, cluster_brokers, etcd, own_streams):
    spark = own_streams
    # a 6 s lease: on a loaded 2-core machine etcd stalls past 3 s leases' 2.2 s fence margin, and members
    # fenced in turn refuse publishes (what this test is about is the kill of one member)
    brokers = {node: cluster_brokers(node, replica_lag_max_ms=2000, lease_ttl_s=6) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    store = open_table_store(spark, str(tmp_path / "tables"), backend="delta-rs")
    addresses = [brokers[node].address for node in NODES]
    spec = FleetSpec(brokers=addresses, count=DEVICES, groups=["canary", "fleet"], failover=True)
    behaviour = quiet_devices(download_delay_s=(0.2, 1.0), offline_duration_s=(0.2, 1.0), failure_rate=0.05)
    groups = {spec.device_id(i): spec.groups[i % len(spec.groups)] for i in range(DEVICES)}
    with FleetProcesses(spec, behaviour, procs=2) as fleet:
        wait_until(lambda: fleet.status()[0] == DEVICES, 90, "every device connected")
        register_devices(store, groups)
        config = ActionsConfig(
            tables_root=str(tmp_path / "tables"),
            checkpoint_root=str(tmp_path / "checkpoints"),
            brokers=[_endpoint(node, brokers[node]) for node in NODES],
            trigger_interval_s=0.5,
            tick_interval_s=0.5,
        )
        job = start_actions_job(spark, config, store)
        try:
            publisher, reports = job.engine.publisher, job.reports
            assert isinstance(publisher, ClusterPublisher)  # found out by asking the brokers
            assert isinstance(reports, ClusterReports)  # one query over the whole cluster

            broadcast = create_action(
                store,
                NewAction(
                    group="canary", version="2.0.0", url="https://example.invalid/fw2.bin", sha256=SHA256
                ),
            )
            wait_until(
                lambda: _completed(store, broadcast),
                ROLLOUT_S,
                "the broadcast to complete",
                lambda: (summary(store, broadcast), fleet.status(), reports.query.exception()),
            )
            sent_before, resent_before = publisher.sent, publisher.resent
            fleet_ids = sorted(d for d, group in groups.items() if group == "fleet")

            rollout = create_action(
                store,
                NewAction(
                    group="fleet",
                    version="3.0.0",
                    url="https://example.invalid/fw3.bin",
                    sha256=SHA256,
                    max_per_minute=RATE_PER_MINUTE,
                ),
            )
            wait_until(lambda: _reached(fleet, rollout) >= 50, ROLLOUT_S, "the rollout under way")
            reached_before_kill = _reached(fleet, rollout)
            brokers["a"].kill()  # the member the job publishes through and reads reports from

            wait_until(
                lambda: _completed(store, rollout),
                ROLLOUT_S,
                "the rollout to complete after the kill",
                lambda: (summary(store, rollout), fleet.status(), publisher.moves, reports.query.exception()),
            )
            assert reached_before_kill < len(fleet_ids)  # the kill came before the rollout was done
            assert publisher.moves >= 1
            assert reports.running()  # the same query read on from the other replicas

            devices: dict[str, dict[str, DeviceTimes]] = {
                action_id: {t.device_id: t for t in fleet.times(action_id)}
                for action_id in (broadcast, rollout)
            }
            for action_id, group in ((broadcast, "canary"), (rollout, "fleet")):
                members = {d for d, g in groups.items() if g == group}
                final = _states(store, action_id)
                assert set(final) == members  # every device of the group, none other
                assert set(final.values()) <= TERMINAL_STATES
                assert final == {d: devices[action_id][d].state for d in members}
                # Acted once: start (IN_PROGRESS, report 1) and end (report 2), or straight to an end;
                # a device that started the action again would have reported a third time.
                assert all(devices[action_id][d].seq <= 2 for d in members)

            # Published once: one broadcast message in each survivor's log (a job publishing to each broker
            # would have put three there). The rollout goes out turn by turn as messages on the devices'
            # bucket topics listing the devices of the turn: each device is listed, and a device listed
            # twice is in a message resent because the killed broker had not acknowledged it.
            for node in ("b", "c"):
                assert len(read_log(brokers[node], "actions/groups/canary")) == 1
            resent = publisher.resent - resent_before
            first_sends = publisher.sent - sent_before - resent
            copies: Counter[str] = Counter()
            messages = 0
            for topic in sorted({bucket_topic(bucket_of(d, DEFAULT_BUCKETS)) for d in fleet_ids}):
                for _, payload in read_log(brokers["b"], topic):
                    body = json.loads(payload)
                    if body["action_id"] == rollout and body["kind"] == "ota":
                        messages += 1
                        copies.update(body["device_ids"])
            assert set(copies) == set(fleet_ids)
            assert first_sends <= messages <= first_sends + resent
        finally:
            job.stop()


def test_the_job_tells_cluster_members_from_standalone_brokers(tmp_path, cluster_brokers):
    member = _endpoint("a", cluster_brokers("a"))
    down = BrokerEndpoint("down", f"http://127.0.0.1:{free_port()}")
    with BrokerProcess(tmp_path / "alone") as alone_broker:
        alone = _endpoint("alone", alone_broker)
        assert probe(member) is BrokerKind.MEMBER
        assert probe(alone) is BrokerKind.STANDALONE
        assert probe(down) is BrokerKind.DOWN
        assert brokers_form_a_cluster([member, down])
        assert not brokers_form_a_cluster([alone, down])
        with pytest.raises(ConfigError, match=r"^brokers: cluster members and standalone brokers mixed"):
            brokers_form_a_cluster([member, alone])
        with pytest.raises(
            BrokersUnreachable, match=r"^no broker answered to tell whether they form a cluster"
        ):
            brokers_form_a_cluster([down])
        assert live_endpoints([down, member]) == [member]
