"""The power-loss filesystem layer as a fixture: mount, cut power, remount the same backing directory.

It needs FUSE: /dev/fuse, libfuse 2 (for fusepy) and the right to mount (root, or fusermount). Where any is
missing, the tests of this directory are skipped and say why; CI runs as root with /dev/fuse and installs
fuse3 and libfuse2 (`.ci/system-deps`), so there they run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.powerloss.lazyfs import POWER_CUT, STATS

REPO = Path(__file__).resolve().parents[3]
MOUNT_TIMEOUT_S = 10.0


def fuse_unavailable() -> str | None:
    """Why FUSE cannot be used here (None when it can)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount is not installed (Debian package fuse3)"
    try:
        import fuse  # noqa: F401  (fusepy loads libfuse 2 when imported)
    except (ImportError, OSError) as exc:
        return f"fusepy cannot load libfuse 2 (Debian package libfuse2): {exc}"
    if os.geteuid() != 0 and not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "not allowed to open /dev/fuse"
    return None


class LazyMount:
    """One mount of the layer over `backing` at `path`; `remount()` after a cut shows the durable state."""

    def __init__(self, backing: Path, path: Path) -> None:
        self.backing, self.path = backing, path
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = backing.parent / "lazyfs.log"

    def mount(self) -> LazyMount:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.powerloss.lazyfs", str(self.backing), str(self.path)],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(self.path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.unmount()
                pytest.fail(f"the layer did not mount: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        return self

    def cut_power(self) -> None:
        """Drop every write not yet synced; from now on the mount fails every operation."""
        os.setxattr(self.path, POWER_CUT, b"1")

    def stats(self) -> dict[str, int]:
        """fsync, fdatasync and syncfs calls the layer has seen since it was mounted."""
        return json.loads(os.getxattr(self.path, STATS))

    def unmount(self) -> None:
        if self.process is None:
            return
        # whatever state the mount is in (after a cut even stat fails on it, so ismount says False)
        command = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount"
        subprocess.run([command, "-u", "-z", str(self.path)], check=False, capture_output=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def remount(self) -> LazyMount:
        self.unmount()
        return self.mount()


@pytest.fixture
def lazy_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LazyMount]:
    """The layer mounted at `tmp_path / "mnt"` over `tmp_path / "disk"`; skipped (saying why) without FUSE."""
    reason = fuse_unavailable()
    if reason:
        pytest.skip(f"power-loss tests need FUSE: {reason}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    backing, path = tmp_path / "disk", tmp_path / "mnt"
    backing.mkdir()
    path.mkdir()
    mount = LazyMount(backing, path).mount()
    try:
        yield mount
    finally:
        mount.unmount()
