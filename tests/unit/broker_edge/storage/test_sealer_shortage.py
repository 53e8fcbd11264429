"""The sealer waits out a shortage of file descriptors: a snapshot that finds the process out of them is
tried again until it is written, not failed (a failed one would leave the next start to recover). Run in a
child process whose ``RLIMIT_NOFILE`` is lowered below what it holds open, then raised again."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, resource, sys, threading
    from broker_edge.storage import AppendRecord, LogStore, StorageConfig

    store = LogStore(sys.argv[1], StorageConfig(partitions=2))
    store.open()
    for number in range(20):
        store.append(f"site/meter/{number}", AppendRecord(payload=str(number).encode()))
    store.flush()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 2, hard))
    threading.Timer(0.5, resource.setrlimit, (resource.RLIMIT_NOFILE, (soft, hard))).start()
    store.close()  # its snapshot meets the shortage, then is written
    sealer = store._sealer
    print(sealer.snapshots, sealer.failure is None)
    again = LogStore(sys.argv[1], StorageConfig(partitions=2))
    report = again.open()
    print(report.clean_shutdown, again.end_offsets()["site/meter/7"])
    again.close()
    """
)


def test_a_snapshot_short_of_descriptors_is_written_once_they_are_back(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "data")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.split("\n")[:2]
    assert first == "1 True"  # written, not failed
    assert second == "True 1"  # so the next start is a clean one, the records there
    assert "out of file descriptors" in done.stderr and "waits (see limits.max_connections" in done.stderr
