"""``timestone broker --workers 2``: a member that hangs (SIGSTOP here; a deadlock, a loop that never yields)
is killed and started again, as a member that crashed is, instead of holding its share of the shared port's
new connections and its partitions for ever."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from broker_edge.runtime.workers_members import HUNG_S
from broker_edge.runtime.workers_supervision import STOP_TIMEOUT_S
from tests.e2e.broker_clients import RawClient
from tests.e2e.cluster.test_workers import cluster_layout, member_pids, workers
from tests.harness.local_cluster import wait_until

pytestmark = pytest.mark.timeout(180)

__all__ = ["workers"]  # the fixture: a --workers 2 command on free ports


def connects(port: int, name: str) -> bool:
    client = RawClient(port, 5)
    try:
        answer = client.connect(name)
    except (OSError, TimeoutError, AssertionError):
        return False
    finally:
        client.close()
    return getattr(answer, "reason_code", None) == 0


def test_a_hung_member_is_killed_and_started_again(workers):
    """A stopped member's listening socket still took its share of new connections (the kernel spreads them
    over every socket of the port), which waited for a CONNACK that never came, and its partitions stayed
    without a leader, as long as it hung."""
    process, port, offsets_api, workers_dir = workers
    log_file = workers_dir.parent.parent / "workers.log"
    wait_until(  # a member still starting is not watched: it would hang unnoticed
        lambda: "2 members serving" in log_file.read_text(errors="replace"), 60, "both members serving"
    )
    hung = member_pids(workers_dir)["w1"]
    os.kill(hung, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        wait_until(lambda: member_pids(workers_dir).get("w1", hung) != hung, HUNG_S + 30, "w1 started again")
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed by then; if not, the fixture stops it
            os.kill(hung, signal.SIGCONT)
    assert time.monotonic() - stopped_at >= HUNG_S - 1.0
    log = log_file.read_text(errors="replace")
    assert f"member w1 (pid {hung}) said nothing for" in log, log[-3000:]

    def leaders_live() -> bool:
        layout = cluster_layout(offsets_api)
        live = {member["node_id"] for member in layout["members"]}
        return live == {"w0", "w1"} and all(p["leader"] in live for p in layout["partitions"])

    wait_until(leaders_live, 60, "both members leading again")
    assert all(connects(port, f"after-{n}") for n in range(8))
    assert process.poll() is None


def test_a_stopped_member_stops_with_the_command_at_once(workers):
    """A member stopped (SIGSTOP: a debugger, a frozen cgroup) when the command is told to stop held its
    SIGTERM pending: the command waited ``STOP_TIMEOUT_S`` (30 s) for it and then killed it, where it could
    stop as the others do (its logs flushed). It is now continued after its SIGTERM and stops at once."""
    process, _, _, workers_dir = workers
    wait_until(lambda: len(member_pids(workers_dir)) == 2, 30, "both members' process ids")
    stopped = member_pids(workers_dir)["w1"]
    os.kill(stopped, signal.SIGSTOP)
    try:
        asked_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(STOP_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGCONT)
    assert time.monotonic() - asked_at < 10, "the stopped member was waited for"
    assert process.returncode == 0
    log = (workers_dir.parent.parent / "workers.log").read_text(errors="replace")
    assert "did not stop within" not in log, log[-3000:]
