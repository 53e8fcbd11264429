"""``timestone devices simulate`` refuses what cannot be simulated and fails when no device can connect."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from broker_edge.runtime.launcher import BrokerProcess, free_port
from pipelines.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--groups", ""], "argument --groups: expected one or more comma-separated group names, got ''"),
        (["--groups", " , "], "argument --groups: expected one or more comma-separated group names"),
        (["--count", "0"], "argument --count: expected 1 or more, got 0"),
        (["--procs", "0"], "argument --procs: expected 1 or more, got 0"),
        # every device was dropped by the broker (0x90, topic name invalid) and connected again, for ever
        (["--telemetry-topic", "x/+/y"], "--telemetry-topic: 'x/+/y': a topic name holds no '+' or '#'"),
        (["--id-prefix", "a/b"], "--id-prefix: 'a/b' contains '/', '+' or '#', which cannot be part"),
        (["--groups", "canary,a+b"], "--groups: 'a+b' contains '/', '+' or '#', which cannot be part"),
        (["--group-id", "p#"], "--group-id: 'p#' contains '/', '+' or '#', which cannot be part"),
    ],
)
def test_impossible_fleets_are_refused(capsys, argv, message):
    with pytest.raises(SystemExit) as refused:
        main(["devices", "simulate", *argv])
    assert refused.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("procs", ["1", "2"])
def test_no_device_connecting_is_a_failure(capsys, procs):
    port = free_port()  # nothing listens there
    argv = ["devices", "simulate", "--broker", f"127.0.0.1:{port}", "--count", "3", "--procs", procs]
    assert main([*argv, "--duration", "30"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"timestone devices simulate: no device could connect to 127.0.0.1:{port}")
    assert "Traceback" not in err


def test_the_demo_refuses_an_empty_fleet(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["demo", "--devices", "0"])
    assert refused.value.code == 2
    assert "argument --devices: expected 1 or more, got 0" in capsys.readouterr().err


def test_ctrl_c_while_a_large_fleet_connects_stops_it_there(tmp_path):
    """3,000 devices at 10 connections a second take five minutes to connect: Ctrl-C meanwhile stops the
    command at once, where it was taken only once every device had connected."""
    with BrokerProcess(tmp_path / "broker") as broker:
        host, port = broker.address
        command = [sys.executable, "-m", "pipelines.cli", "devices", "simulate", "--broker", f"{host}:{port}"]
        simulating = subprocess.Popen(
            [*command, "--count", "3000", "--connects-per-second", "10"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_for_clients(broker, 3)
            simulating.send_signal(signal.SIGINT)
            out, err = simulating.communicate(timeout=20)
        finally:
            simulating.kill()
    assert simulating.returncode == 0, err
    assert "Traceback" not in err
    [line] = [line for line in out.splitlines() if line.startswith("stopped while connecting: ")]
    connected = int(line.split()[3])
    assert 1 <= connected < 3000, line  # (the broker counts a device before its CONNACK reaches it)


def _wait_for_clients(broker: BrokerProcess, count: int) -> None:
    """Until ``count`` clients are connected to ``broker`` (its admin endpoint's gauge)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        gauges = [line for line in text.splitlines() if line.startswith("timestone_broker_connections{")]
        if sum(float(line.rsplit(" ", 1)[1]) for line in gauges) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} clients connected within 60 s")
