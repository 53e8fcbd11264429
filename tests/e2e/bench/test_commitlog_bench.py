"""The commitlog benchmark's append runs: real appends, their bytes and windows, and `dd` in their pattern."""

from __future__ import annotations

import pytest

from bench.commitlog_bench import bench_append
from broker_edge.storage import Durability
from broker_edge.storage.entry import HEAD_SIZE
from broker_edge.storage.record import encode_frame


@pytest.mark.parametrize("policy", ["group", "none"])
def test_appends_are_measured_next_to_dd_in_their_pattern(tmp_path, policy: Durability) -> None:
    result = bench_append(tmp_path, policy, 200, 2000, repeat=2)
    frame_bytes = len(encode_frame(0, 0, b"x" * 200, 1, False, "bench-device-0001", (), None, None))
    # each record is an entry of its partition log: the entry's head (topic id, check), then the frame
    assert result.records == 2000 and result.bytes == 2000 * (HEAD_SIZE + frame_bytes)
    assert 1 <= result.windows <= 2000
    flags = "oflag=dsync" if policy == "group" else "conv=fdatasync"
    assert result.disk_pattern.startswith("dd bs=") and result.disk_pattern.endswith(flags)
    assert result.seconds > 0 and result.disk_seconds > 0 and result.cpu_seconds > 0
    # the same sync pattern on both sides: group syncs once per window, none once at the end
    assert result.syncs == result.disk_syncs == (result.windows if policy == "group" else 1)
    assert f"count={result.windows}" in result.disk_pattern


def test_fsync_single_appends_sync_every_record_and_so_does_dd(tmp_path) -> None:
    batched = bench_append(tmp_path / "batched", "fsync", 200, 300, repeat=1)
    single = bench_append(tmp_path / "single", "fsync", 200, 300, repeat=1, batched=False)
    assert single.syncs == single.disk_syncs == 300
    assert single.disk_pattern.endswith("count=300 oflag=dsync")
    assert batched.syncs == batched.disk_syncs == 2  # one append_batch of 256, then 44
