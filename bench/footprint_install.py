"""Size on disk of an install: a fresh virtualenv with only `pip install <repo>[extras]` in it.

The project is installed as a wheel built from the working tree (not editable), with pip's ordinary
resolver, so the figure is what `pip install timestone` leaves on a gateway: the interpreter's venv
scaffolding (pip itself) is reported apart from what the install added.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.sysinfo import dir_bytes

REPO = Path(__file__).resolve().parent.parent
INSTALL_TIMEOUT_S = 900


@dataclass(frozen=True)
class InstallSize:
    """What one install added to a fresh virtualenv."""

    extras: str
    added_bytes: int
    packages: list[tuple[str, int]]
    """(distribution directory in site-packages, bytes), largest first."""
    venv: Path
    """The virtualenv (removed when `installed` returns)."""

    @property
    def timestone(self) -> Path:
        """The `timestone` command of this install."""
        return self.venv / "bin" / "timestone"


@contextlib.contextmanager
def installed(extras: str = "") -> Iterator[InstallSize]:
    """Install the project (with `extras`, e.g. "arrow") into a fresh venv, measure what it added, and
    keep the venv while the block runs (to start its broker)."""
    with tempfile.TemporaryDirectory(prefix="footprint-install-") as tmp:
        venv = Path(tmp) / "venv"
        _run([sys.executable, "-m", "venv", str(venv)])
        python = venv / "bin" / "python"
        site = Path(
            _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
        )
        before = dir_bytes(venv)
        before_entries = {p.name for p in site.iterdir()}
        target = f"{REPO}[{extras}]" if extras else str(REPO)
        build = REPO / "build"
        built_before = build.exists()
        try:
            _run([str(python), "-m", "pip", "install", "--quiet", "--no-warn-script-location", target])
        finally:
            if not built_before:  # the wheel's build leaves build/ in the working tree: not ours to keep
                shutil.rmtree(build, ignore_errors=True)
        added = dir_bytes(venv) - before
        packages = sorted(
            ((p.name, dir_bytes(p) if p.is_dir() else p.stat().st_size) for p in site.iterdir()),
            key=lambda item: -item[1],
        )
        new = [(name, size) for name, size in packages if name not in before_entries]
        yield InstallSize(extras, added, new, venv)


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    if done.returncode:
        raise RuntimeError(f"`{' '.join(command)}` failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout
