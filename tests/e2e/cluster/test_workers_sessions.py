"""``timestone broker --workers 2``: a persistent session whose member is killed (SIGKILL) resumes on the
other member with every QoS 1 message published to it since, of topics created after its state was last
saved as well, wherever their partition's log is (the members keep one copy each)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import time
import urllib.request

import pytest

from tests.e2e.broker_clients import PahoClient
from tests.e2e.cluster.test_workers import (
    cluster_layout,
    leader_of,
    member_pids,
    read_topic,
    settled_layout,
    workers,
)
from tests.harness.local_cluster import wait_until

pytestmark = pytest.mark.timeout(180)

__all__ = ["workers"]  # the fixture: a --workers 2 command on free ports


def own_ports(offsets_api: str) -> dict[str, int]:
    layout = cluster_layout(offsets_api)
    return {member["node_id"]: int(member["mqtt"].rsplit(":", 1)[1]) for member in layout["members"]}


def test_a_session_resumed_after_its_members_death_gets_the_topics_created_since_its_last_save(workers):
    """Its saved state names the topics its subscription read when saved; one created since, on a
    partition the member restoring the session holds no copy of, was never delivered: the acknowledged
    messages of it were skipped without a word. Topics created since are read from their start."""
    _, _, offsets_api, workers_dir = workers
    partitions = settled_layout(offsets_api, {"w0", "w1"})["partitions"]
    wait_until(lambda: len(member_pids(workers_dir)) == 2, 30, "both members' process ids")
    ports = own_ports(offsets_api)
    [on_w0, on_w1] = [
        next(t for t in (f"fleet/d{n}/state" for n in range(1000)) if leader_of(partitions, t) == node)
        for node in ("w0", "w1")
    ]
    subscriber = PahoClient(ports["w0"], "keeper", clean=False, session_expiry=600)
    subscriber.subscribe("fleet/#", qos=1)
    subscriber.disconnect()
    time.sleep(3.0)  # its state saved (each session_save_interval_ms, 1 s; longer when loaded): no topic yet
    publisher = PahoClient(ports["w1"], "publisher")
    for topic in (on_w0, on_w1):
        publisher.publish(topic, f"first of {topic}".encode(), qos=1)
    publisher.close()
    wait_until(lambda: bool(read_topic(offsets_api, on_w0)), 10, "published")
    os.kill(member_pids(workers_dir)["w0"], signal.SIGKILL)
    wait_until(lambda: "w0" in own_ports(offsets_api) and _serves(offsets_api), 60, "w0 started again")

    resumed = PahoClient(ports["w1"], "keeper", clean=False, session_expiry=600)
    assert resumed.connack_result[0].session_present
    expected = {f"first of {on_w0}".encode(), f"first of {on_w1}".encode()}
    got: set[bytes] = set()
    deadline = time.monotonic() + 10
    while got != expected and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            got.add(resumed.messages.get(timeout=0.2).payload)
    assert got == expected
    resumed.expect_none(1.0)
    resumed.disconnect()


def _serves(offsets_api: str) -> bool:
    """Whether every partition has a live leader again."""
    with urllib.request.urlopen(f"{offsets_api}/v1/cluster", timeout=10) as answer:
        layout = json.load(answer)
    live = {member["node_id"] for member in layout["members"]}
    return all(partition["leader"] in live for partition in layout["partitions"])
