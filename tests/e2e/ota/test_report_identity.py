"""A status report counts only for the device that sent it: the broker records each record's publisher (its
client id), and the actions job takes a report whose ``device_id`` is that client id, so a device allowed to
publish on a shared report topic cannot fail, finish or add another device (docs/ota.md, "Who may report for
a device").

Written as the attack on a broker that requires passwords: two real devices, each logged in as itself; one
posts reports naming the other (a FAILED that would abort the rollout, a SUCCEEDED for a device that never
installed, a late joiner of an ``all`` broadcast that does not exist), then its own report after them on the
same topic, so once its own report has landed the forged ones have been read too.
"""

from __future__ import annotations

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.security.auth import PasswordFile
from pipelines.actions.buckets import bucket_of, bucket_topic, report_topic
from pipelines.actions.config import ActionsConfig, BrokerEndpoint
from pipelines.actions.job import start_actions_job
from pipelines.actions.model import ALL_TOPIC
from pipelines.actions.operator import NewAction, create_action
from sinks import open_table_store
from tests.e2e.broker_clients import PahoClient
from tests.e2e.ota.conftest import SHA256, device_report, summary, wait_for
from tests.e2e.security.certificate_devices import certificate_holder, certificate_listener

BUCKETS = 4
DEVICES = ("dev-a", "dev-b")


def _acl(**report_rule: bool) -> dict:
    """The job (``ops``) everywhere; devices read the actions and report on every bucket's report topic."""
    return {
        "rules": [
            {"permission": "allow", "action": "all", "topic": "#", "users": ["ops"]},
            {"permission": "allow", "action": "publish", "topic": "actions/reports/+", **report_rule},
            {"permission": "allow", "action": "subscribe", "topic": "actions/buckets/+"},
            {"permission": "allow", "action": "subscribe", "topic": "actions/all"},
        ]
    }


@pytest.fixture
def passwords(tmp_path):
    path = tmp_path / "passwd"
    PasswordFile.set_password(path, "ops", "pw-ops", create=True)
    for device in DEVICES:
        PasswordFile.set_password(path, device, f"pw-{device}")
    return str(path)


@pytest.fixture
def stack(spark, tmp_path, passwords):
    """A broker with passwords and an ACL, and the actions job on it, logged in as ``ops``."""
    store = open_table_store(spark, str(tmp_path / "tables"), backend="delta-rs")
    with BrokerProcess(
        tmp_path / "broker", auth={"password_file": passwords, "allow_anonymous": False}, acl=_acl()
    ) as broker:
        config = ActionsConfig(
            tables_root=str(tmp_path / "tables"),
            checkpoint_root=str(tmp_path / "checkpoints"),
            brokers=[
                BrokerEndpoint(
                    mqtt_port=broker.port,
                    offsets_api=broker.offsets_url,
                    username="ops",
                    password="pw-ops",
                )
            ],
            cluster=False,
            trigger_interval_s=0.5,
            tick_interval_s=0.5,
            device_buckets=BUCKETS,
        )
        job = start_actions_job(spark, config, store)
        try:
            yield broker, store
        finally:
            job.stop()


def _device(port: int, device_id: str, client_id: str | None = None) -> PahoClient:
    return PahoClient(port, client_id or device_id, username=device_id, password=f"pw-{device_id}")


def test_a_device_cannot_fail_finish_or_add_another_device(stack):
    broker, store = stack
    dev_a, dev_b = (_device(broker.port, device) for device in DEVICES)
    for device, client in (("dev-a", dev_a), ("dev-b", dev_b)):
        client.subscribe(bucket_topic(bucket_of(device, BUCKETS)), 1)
    dev_b.subscribe(ALL_TOPIC, 1)
    rollout = create_action(
        store,
        NewAction(
            device_ids=list(DEVICES),
            version="2.0.0",
            url="https://x.invalid/fw",
            sha256=SHA256,
            failure_pct=50,
            min_executed=1,
        ),
    )
    dev_a.expect(1, timeout=60)
    dev_b.expect(1, timeout=60)
    everyone = create_action(
        store, NewAction(all_devices=True, version="2.0.0", url="https://x.invalid/fw", sha256=SHA256)
    )
    dev_b.expect(1, timeout=60)

    own = report_topic(bucket_of("dev-b", BUCKETS))
    dev_b.publish(own, device_report(rollout, "dev-a", "FAILED"), qos=1)  # would abort the rollout
    dev_b.publish(own, device_report(everyone, "dev-ghost", "FAILED"), qos=1)  # a late joiner nobody is
    dev_b.publish(own, device_report(everyone, "dev-a", "SUCCEEDED"), qos=1)  # dev-a never installed it
    dev_b.publish(own, device_report(rollout, "dev-b", "SUCCEEDED"), qos=1)
    dev_b.publish(own, device_report(everyone, "dev-b", "SUCCEEDED"), qos=1)

    def landed(action_id: str) -> bool:
        row = summary(store, action_id)
        return row is not None and row["succeeded_count"] >= 1

    wait_for(lambda: landed(rollout) and landed(everyone), timeout_s=60, what="dev-b's own reports")
    rollout_row = summary(store, rollout)
    everyone_row = summary(store, everyone)
    assert rollout_row is not None and everyone_row is not None
    assert (rollout_row["failed_count"], rollout_row["action_state"]) == (0, "IN_PROGRESS")
    assert (everyone_row["succeeded_count"], everyone_row["failed_count"]) == (1, 0)
    assert everyone_row["total_count"] == 1  # no row for dev-ghost nor dev-a


def test_a_device_logged_in_as_itself_cannot_take_another_devices_client_id(tmp_path, passwords):
    """The ACL rule condition ``client_is_user`` keeps a report's recorded client id its device's own: dev-b
    logged in with dev-a's client id may not publish on a report topic (MQTT 5 PUBACK 0x87), so nothing it
    sends there reaches the log; logged in as itself, it may."""
    auth = {"password_file": passwords, "allow_anonymous": False}
    with BrokerProcess(tmp_path / "broker", auth=auth, acl=_acl(client_is_user=True)) as broker:
        impostor = _device(broker.port, "dev-b", client_id="dev-a")
        impostor.publish(report_topic(0), device_report("a-1", "dev-a", "FAILED"), qos=1, refusal=0x87)
        _device(broker.port, "dev-b").publish(report_topic(0), device_report("a-1", "dev-b", "FAILED"), qos=1)


def test_a_device_with_a_certificate_cannot_take_another_devices_client_id(start_broker, tmp_path):
    """With client certificates instead of passwords, the subject CN is the login ``client_is_user``
    compares: the holder of dev-b's certificate connecting as client dev-a may not report."""
    pki = LocalPki(tmp_path / "pki", name="fleet-ca")
    broker = start_broker(listeners=[certificate_listener(pki)], acl=_acl(client_is_user=True))

    def holder_of(device_id: str, client_id: str) -> PahoClient:
        return certificate_holder(pki, broker.port, device_id, client_id)

    report = device_report("a-1", "dev-a", "FAILED")
    impostor = holder_of("dev-b", "dev-a")
    impostor.publish(report_topic(0), report, qos=1, refusal=0x87)
    impostor.disconnect()  # (while connected, it holds the client id: docs/security.md, sessions)
    holder_of("dev-a", "dev-a").publish(report_topic(0), report, qos=1)
