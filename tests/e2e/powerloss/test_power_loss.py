"""A power cut while four clients publish QoS 1 loses no acknowledged message, unless nothing is synced.

The broker's storage directory lives on `lazyfs` (see `lazyfs.py`): writes stay in memory until fsync,
fdatasync or syncfs makes them durable, and the power cut drops the rest, as the page cache would be lost
with the machine. A SIGKILL alone keeps the page cache, so it cannot tell a synced log from an unsynced
one; this test can. Four lean MQTT clients number their QoS 1 messages on one topic; power is cut mid-
stream (the layer fails every later operation, then the broker is killed), the filesystem is remounted
with what was durable, the broker restarts and the log is read back through the offsets API.

With `group` (per-segment fdatasync, and the syncfs path) and `fsync`: every PUBACKed message is there
exactly once, in order per publisher. With `none` the same run must lose acknowledged messages: the
proof that the test sees the difference.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.storage.fs_sync import syncfs_available
from tests.e2e.broker_clients import wait_for
from tests.e2e.commitlog.e2e_helpers import LoopThread, read_log
from tests.e2e.commitlog.test_crash_recovery import TOPIC, LeanPublisher
from tests.e2e.powerloss.conftest import LazyMount

PUBLISHERS = 4
ACKED_BEFORE_CUT = 300


class SyncfsForwardingBroker(BrokerProcess):
    """The broker whose syncfs calls the layer also sees (Linux does not pass syncfs to FUSE servers)."""

    module = "tests.e2e.powerloss.syncfs_forwarding"


def publish_then_cut_power(
    mount: LazyMount, workdir: Path, storage: dict[str, Any], broker_type: type[BrokerProcess] = BrokerProcess
) -> tuple[dict[str, list[int]], list[dict], dict[str, int]]:
    """(acknowledged seqs per publisher, the log after the restart, syncs the layer saw before the cut)."""
    sections: dict[str, Any] = {
        "storage": {"directory": str(mount.path / "data"), **storage},
        "limits": {"messages_per_second_per_client": 0},
    }
    broker = broker_type(workdir, **sections).start()
    loop = LoopThread()
    try:
        publishers = [LeanPublisher(f"device-{n}", broker.port, loop) for n in range(PUBLISHERS)]
        everyone_acked = wait_for(lambda: min(len(p.acked) for p in publishers) >= ACKED_BEFORE_CUT, 60)
        syncs = mount.stats()
        mount.cut_power()  # mid-stream: every publisher has messages in flight
        broker.kill()
        for publisher in publishers:
            publisher.task.result(timeout=10)
        acked = {p.name: sorted(p.acked) for p in publishers}
        assert everyone_acked, f"publishers got {[len(p.acked) for p in publishers]} PUBACKs before the cut"

        mount.remount()
        broker = broker_type(workdir, **sections).start()
        with OffsetsClient(broker.offsets_url, retry_backoff_s=0.2) as client:
            rows = read_log(client, TOPIC)
    finally:
        loop.close()
        broker.stop()
    return acked, rows, syncs


def sequences(rows: list[dict]) -> dict[str, list[int]]:
    """Each publisher's numbers in log order."""
    logged: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        name, seq = row["payload"].decode().split(":")
        logged[name].append(int(seq))
    return logged


@pytest.mark.parametrize(
    ("storage", "sync_call", "broker_type"),
    [
        pytest.param(
            {"durability": "group", "syncfs_min_segments": 0},
            "fdatasync",
            BrokerProcess,
            id="group-fdatasync",
        ),
        pytest.param(
            {"durability": "group", "syncfs_min_segments": 1},
            "syncfs",
            SyncfsForwardingBroker,
            id="group-syncfs",
        ),
        pytest.param({"durability": "fsync"}, "fdatasync", BrokerProcess, id="fsync"),
        # syncfs does not reach a FUSE server: on this mount the store must fdatasync instead
        pytest.param(
            {"durability": "group", "syncfs_min_segments": 1},
            "fdatasync",
            BrokerProcess,
            id="group-syncfs-off-on-fuse",
        ),
    ],
)
def test_power_cut_keeps_every_acknowledged_message_once_and_in_order(
    lazy_mount: LazyMount, tmp_path: Path, storage: dict, sync_call: str, broker_type: type[BrokerProcess]
):
    acked, rows, syncs = publish_then_cut_power(lazy_mount, tmp_path / "broker", storage, broker_type)

    assert syncs.get(sync_call, 0) > 0, f"the {sync_call} path was not taken: {syncs}"
    assert sync_call == "syncfs" or syncs.get("syncfs", 0) == 0
    logged = sequences(rows)
    for name, seqs in acked.items():
        assert logged[name] == sorted(set(logged[name])), f"{name}: duplicated or out of order"
        missing = set(seqs) - set(logged[name])
        assert not missing, f"{name}: acknowledged but lost at the power cut: {sorted(missing)[:10]}"


def test_power_cut_loses_acknowledged_messages_when_nothing_is_synced(lazy_mount: LazyMount, tmp_path: Path):
    """`durability: none` acknowledges what is only in the page cache: the power cut must lose some of it."""
    acked, rows, syncs = publish_then_cut_power(lazy_mount, tmp_path / "broker", {"durability": "none"})

    assert syncs.get("syncfs", 0) == 0
    logged = sequences(rows)
    lost = {name: set(seqs) - set(logged[name]) for name, seqs in acked.items()}
    assert sum(len(missing) for missing in lost.values()) > 0, "no acknowledged message was lost"


def test_the_store_does_not_count_on_syncfs_where_it_does_not_reach_the_filesystem(
    lazy_mount: LazyMount, tmp_path: Path
):
    assert syncfs_available(tmp_path)
    assert not syncfs_available(lazy_mount.path)
