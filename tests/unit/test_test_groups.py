"""``make test`` runs the suite on two pytest-xdist workers with ``--dist loadgroup``: the groups that
tests/conftest.py marks (a module, or the tests of a costly session fixture) must each run on one worker,
or their fixtures start once per worker (the demo twice, a module's cluster twice)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]

MODULE = """
import os
from pathlib import Path

import pytest


@pytest.mark.parametrize("n", range(6))
def test_records_its_worker(n):
    out = Path(os.environ["GROUPS_OUT"]) / f"{Path(__file__).stem}-{n}"
    out.write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_each_module_runs_whole_on_one_worker(tmp_path):
    suite = tmp_path / "tests"
    suite.mkdir()
    (suite / "conftest.py").write_text((REPOSITORY / "tests" / "conftest.py").read_text())
    for name in ("test_first", "test_second"):
        (suite / f"{name}.py").write_text(MODULE)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "GROUPS_OUT": str(out), "PYTHONPATH": str(REPOSITORY)}
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    run = subprocess.run(
        [*pytest, "-n", "2", "--dist", "loadgroup", str(suite)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for record in out.iterdir():
        workers.setdefault(record.name.rsplit("-", 1)[0], set()).add(record.read_text())
    assert sorted(workers) == ["test_first", "test_second"]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), workers
