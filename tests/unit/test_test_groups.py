"""``make test`` runs the suite on two pytest-xdist workers with ``--dist loadgroup``: the groups that
tests/conftest.py marks (a module, or the tests of a costly session fixture) must each run on one worker,
or their fixtures start once per worker (the demo twice, a module's cluster twice), and the costliest groups
go first (tests/durations.py), or a long one collected last runs alone at the end."""

from __future__ import annotations

import json
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


IN_ORDER = """
import os
import time
from pathlib import Path

import pytest


@pytest.mark.parametrize("n", range(3))
def test_records_its_turn(n):
    time.sleep(0.05)
    with open(Path(os.environ["GROUPS_OUT"]) / "order", "a") as order:
        order.write(Path(__file__).stem + "\\n")
"""


def run_suite(tmp_path: Path, modules: dict[str, str], *options: str) -> Path:
    """Runs ``modules`` under the suite's conftest with ``options``; the folder its tests wrote to."""
    suite = tmp_path / "tests"
    suite.mkdir(exist_ok=True)
    (suite / "conftest.py").write_text((REPOSITORY / "tests" / "conftest.py").read_text())
    for name, text in modules.items():
        (suite / f"{name}.py").write_text(text)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "GROUPS_OUT": str(out), "PYTHONPATH": str(REPOSITORY)}
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    run = subprocess.run(
        [*pytest, *options, str(suite)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return out


def modules_in_turn(out: Path) -> list[str]:
    turns = out.joinpath("order").read_text().split()
    return [module for index, module in enumerate(turns) if index == 0 or turns[index - 1] != module]


def test_each_module_runs_whole_on_one_worker(tmp_path):
    out = run_suite(tmp_path, {"test_first": MODULE, "test_second": MODULE}, "-n", "2", "--dist", "loadgroup")
    workers: dict[str, set[str]] = {}
    for record in out.iterdir():
        workers.setdefault(record.name.rsplit("-", 1)[0], set()).add(record.read_text())
    assert sorted(workers) == ["test_first", "test_second"]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), workers


def test_the_costliest_groups_go_first_and_a_module_not_on_record_counts_a_second_a_test(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "durations.json").write_text(
        json.dumps({"tests/test_third.py": 30.0, "tests/test_first.py": 2.0, "tests/test_gone.py": 99.0})
    )
    modules = {name: IN_ORDER for name in ("test_first", "test_second", "test_third")}
    out = run_suite(tmp_path, modules, "-n", "1", "--dist", "loadgroup")
    assert modules_in_turn(out) == ["test_third", "test_second", "test_first"]


def test_without_xdist_the_suite_runs_in_collection_order(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "durations.json").write_text(json.dumps({"tests/test_third.py": 30.0}))
    out = run_suite(tmp_path, {name: IN_ORDER for name in ("test_first", "test_third")})
    assert modules_in_turn(out) == ["test_first", "test_third"]


def test_record_durations_writes_the_seconds_of_every_module_from_every_worker(tmp_path):
    record = tmp_path / "recorded.json"
    modules = {name: IN_ORDER for name in ("test_first", "test_second")}
    run_suite(tmp_path, modules, "-n", "2", "--dist", "loadgroup", "--record-durations", str(record))
    recorded = json.loads(record.read_text())
    assert sorted(recorded) == ["tests/test_first.py", "tests/test_second.py"]
    assert all(seconds >= 0.1 for seconds in recorded.values()), recorded
