"""SIGHUP re-reads the ACL file of a running broker process; a broken file keeps the rules in force."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import yaml

from broker_edge.protocol.packets import PubAck, Publish
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import RawClient, wait_for

NOT_AUTHORIZED = 0x87
ACCEPTED = 0x10  # No matching subscribers: accepted, nobody listens


def publish_reason(port: int, topic: str, user: str | None = None, password: str = "") -> int:
    """The reason code of the PUBACK to one QoS 1 PUBLISH of ``topic`` (as ``user``, else anonymously)."""
    client = RawClient(port, 5)
    try:
        login = {"username": user, "password": password.encode()} if user is not None else {}
        assert client.connect(f"c{time.monotonic_ns()}", **login).reason_code == 0
        client.send_packet(Publish(topic, b"x", 1, packet_id=1))
        ack = client.recv()
        assert isinstance(ack, PubAck)
        return ack.reason_code
    finally:
        client.close()


def write_rules(path: Path, *topics: str) -> None:
    rules = [{"permission": "allow", "action": "publish", "topic": topic} for topic in topics]
    path.write_text(yaml.safe_dump({"rules": rules}, sort_keys=False))


def test_sighup_reloads_the_acl_file_and_a_bad_file_keeps_the_old_rules(tmp_path: Path) -> None:
    acl_file = tmp_path / "acl.yaml"
    write_rules(acl_file, "open/#")
    with BrokerProcess(tmp_path / "broker", acl={"file": str(acl_file), "default": "deny"}) as broker:
        assert broker.process is not None
        assert publish_reason(broker.port, "open/a") == ACCEPTED
        assert publish_reason(broker.port, "secret/a") == NOT_AUTHORIZED

        write_rules(acl_file, "open/#", "secret/#")
        os.kill(broker.process.pid, signal.SIGHUP)
        assert wait_for(
            lambda: (
                "ACL file" in broker.log_path.read_text()
                and "reloaded: 2 rules" in broker.log_path.read_text()
            )
        )
        assert publish_reason(broker.port, "secret/a") == ACCEPTED

        acl_file.write_text(
            "rules:\n"
            "  - permission: allow\n"
            "    action: publish\n"
            "    topic: open/#\n"
            "  - permission: maybe\n"
            "    action: publish\n"
            "    topic: secret/#\n"
        )
        os.kill(broker.process.pid, signal.SIGHUP)
        assert wait_for(lambda: "not reloaded" in broker.log_path.read_text())
        logged = next(line for line in broker.log_path.read_text().splitlines() if "not reloaded" in line)
        assert f"{acl_file}, line 5" in logged and "permission" in logged, logged
        assert publish_reason(broker.port, "secret/a") == ACCEPTED, "the previous rules stay in force"
        assert publish_reason(broker.port, "other/a") == NOT_AUTHORIZED
