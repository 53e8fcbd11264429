"""The store's file pool: closing it releases every descriptor, even when a close reports a lost write."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from broker_edge.storage import file_pool
from broker_edge.storage.file_pool import FileHandlePool


def test_a_close_that_fails_leaves_no_other_descriptor_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close(2)`` on a failing disk returns ``EIO`` for a write it lost, and has released the descriptor
    all the same: the pool stopped at the first such error and kept every later file open (a FUSE mount
    under a store closed that way could not go away)."""
    pool = FileHandlePool()
    for number in range(3):
        pool.pwritev(str(tmp_path / f"{number}.log"), [b"reading"], 0)
    descriptors: list[int] = []
    real_close = os.close

    def close_reporting_a_lost_write(fd: int) -> None:
        real_close(fd)
        descriptors.append(fd)
        if len(descriptors) == 1:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(file_pool.os, "close", close_reporting_a_lost_write)
    with pytest.raises(OSError, match="Input/output error"):
        pool.close()
    monkeypatch.undo()
    assert len(descriptors) == 3 and pool.open_count == 0
    for fd in descriptors:
        with pytest.raises(OSError) as closed:
            os.fstat(fd)
        assert closed.value.errno == errno.EBADF
