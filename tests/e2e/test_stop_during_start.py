"""Ctrl-C at any moment of a broker's start: a clean stop (exit 0, no traceback, the data directory free
again), in the foreground and in the background of a shell (SIGINT inherited ignored).

Each run starts ``timestone broker`` as its console script does (``python -m pipelines.cli``) and waits until
the command's own code has taken the signals (SIGTERM caught: ``SigCgt`` in ``/proc/<pid>/status``; before
that the interpreter itself is starting), then sends SIGINT after a delay. The delays are spread over the
time a start takes on this machine, measured first, so every phase is hit whatever the load: loading the
modules, reading the configuration, opening the store, binding the listeners and endpoints; and a cluster
member whose etcd does not answer stops as cleanly.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_edge.runtime.launcher import free_port

pytestmark = pytest.mark.timeout(240)

STARTED = "broker started:"


def write_config(directory: Path, **sections: Any) -> Path:
    document = {
        "listeners": [{"name": "mqtt", "host": "127.0.0.1", "port": 0}],
        "offsets_api": {"port": 0},
        "admin_http": {"port": 0},
        "storage": {"directory": str(directory / "data")},
        **sections,
    }
    path = directory / "broker.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def catches_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a shell does to a job it starts with `&`


class Run:
    """One ``timestone broker`` process, its output in ``log``."""

    def __init__(self, config: Path, log: Path, background: bool = False, imports: bool = False) -> None:
        self.log = log
        self.output = open(log, "wb")  # noqa: SIM115 - closed in `finish`
        python = [sys.executable, "-X", "importtime"] if imports else [sys.executable]
        self.process = subprocess.Popen(
            [*python, "-m", "pipelines.cli", "broker", "--config", str(config)],
            stdout=self.output,
            stderr=subprocess.STDOUT,
            preexec_fn=ignore_sigint if background else None,
        )
        deadline = time.monotonic() + 30
        while not catches_sigterm(self.process.pid):
            assert self.process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the command never took SIGTERM"
            time.sleep(0.001)
        self.caught_at = time.monotonic()
        self.output_when_caught = log.read_text()

    def finish(self, timeout_s: float = 30) -> tuple[int, str]:
        code = self.process.wait(timeout=timeout_s)
        self.output.close()
        return code, self.log.read_text()


def start_time(config: Path, directory: Path) -> float:
    """Seconds from the signals taken to ``broker started`` on this machine now. The signals are taken before
    the broker's modules load (``-X importtime`` says each import as it ends)."""
    run = Run(config, directory / "measure.log", imports=True)
    assert "| broker_edge.settings.broker" not in run.output_when_caught
    assert "| broker_edge.runtime.main" not in run.output_when_caught
    while STARTED not in run.log.read_text():
        assert run.process.poll() is None, run.log.read_text()
        time.sleep(0.005)
    took = time.monotonic() - run.caught_at
    run.process.send_signal(signal.SIGINT)
    assert run.finish()[0] == 0
    return took


def test_ctrl_c_at_any_moment_of_the_start_stops_the_broker_cleanly(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    took = start_time(config, tmp_path)
    delays = [took * step / 10 for step in range(12)]  # from the first moment to just after the start
    outcomes = []
    for number, delay in enumerate(delays):
        run = Run(config, tmp_path / f"run-{number}.log", background=number % 2 == 1)
        time.sleep(max(0.0, run.caught_at + delay - time.monotonic()))
        run.process.send_signal(signal.SIGINT)
        code, output = run.finish()
        outcomes.append((number, code, "Traceback" in output or "KeyboardInterrupt" in output))
        assert "broker stopped" in output or STARTED not in output, output
    assert outcomes == [(number, 0, False) for number in range(len(delays))]
    # the data directory is free again: a broker starts on it and stops
    last = Run(config, tmp_path / "last.log")
    while STARTED not in last.log.read_text():
        assert last.process.poll() is None, last.log.read_text()
        time.sleep(0.01)
    last.process.send_signal(signal.SIGTERM)
    assert last.finish()[0] == 0


def test_ctrl_c_stops_a_member_whose_etcd_does_not_answer(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        cluster={"node_id": "b1", "etcd": [f"http://127.0.0.1:{free_port()}"], "listen": {"port": 0}},
    )
    run = Run(config, tmp_path / "member.log", background=True)
    while "listening: mqtt" not in run.log.read_text():
        assert run.process.poll() is None, run.log.read_text()
        time.sleep(0.01)
    time.sleep(1.0)  # joining the cluster: etcd never answers
    run.process.send_signal(signal.SIGINT)
    code, output = run.finish(timeout_s=15)
    assert code == 0, output
    assert "stopped during start-up" in output or "broker stopped" in output
    assert "Traceback" not in output
