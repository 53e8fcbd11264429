"""Every benchmark `make bench` runs starts from the repository root, as the Makefile spells it."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def make_bench_commands() -> list[list[str]]:
    """The Python commands of the Makefile's `bench` target, with this interpreter in place of the venv's."""
    recipe = (REPO / "Makefile").read_text().split("\nbench:", 1)[1].splitlines()[1:]
    commands = []
    for line in recipe:
        if not line.startswith("\t"):
            break
        words = line.split()
        if words[0] == "$(VENV)/bin/python":
            commands.append([sys.executable, *(word for word in words[1:] if word != "--write")])
    return commands


def test_make_bench_runs_every_benchmark() -> None:
    scripts = {" ".join(command[1:]) for command in make_bench_commands()}
    assert "-m bench" in scripts
    assert len(scripts) >= 9


@pytest.mark.parametrize("command", make_bench_commands(), ids=lambda command: " ".join(command[1:]))
def test_each_make_bench_command_starts(command: list[str]) -> None:
    done = subprocess.run([*command, "--help"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
