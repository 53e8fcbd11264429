"""``timestone devices simulate`` refuses what cannot be simulated and fails when no device can connect."""

from __future__ import annotations

import pytest

from broker_edge.runtime.launcher import free_port
from pipelines.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--groups", ""], "argument --groups: expected one or more comma-separated group names, got ''"),
        (["--groups", " , "], "argument --groups: expected one or more comma-separated group names"),
        (["--count", "0"], "argument --count: expected 1 or more, got 0"),
        (["--procs", "0"], "argument --procs: expected 1 or more, got 0"),
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
