"""`timestone broker` whose syncfs(2) calls also reach the power-loss filesystem layer.

Linux does not pass syncfs to a /dev/fuse server (see `lazyfs.py`), so the layer cannot see the broker's
syncfs path by itself, and the store does not use syncfs on FUSE. This entry point runs the real command
with the store's `sync_filesystem` wrapped: the real syncfs runs first, then the layer is told through the
`user.lazyfs.syncfs` attribute on the same descriptor, which makes the whole mount durable, as syncfs
would; and since syncfs now reaches the layer, the store is told it may use it. Nothing else changes.

Run: python -m tests.e2e.powerloss.syncfs_forwarding broker --config FILE
"""

from __future__ import annotations

import os
import sys

from broker_edge.storage import fs_sync, group_commit, store_state
from pipelines.cli import main
from tests.e2e.powerloss.lazyfs import SYNCFS


def sync_filesystem_and_tell_the_layer(fd: int) -> None:
    """The store's syncfs, then the same made visible to the layer."""
    fs_sync.sync_filesystem(fd)
    os.setxattr(fd, SYNCFS, b"1")


if __name__ == "__main__":
    group_commit.sync_filesystem = sync_filesystem_and_tell_the_layer
    store_state.syncfs_available = lambda directory=None: fs_sync.syncfs_available()
    raise SystemExit(main(sys.argv[1:]))
