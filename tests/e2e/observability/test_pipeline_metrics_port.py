"""``timestone pipeline <name> --metrics-port``: a port it cannot serve is one line and a status, before Spark
starts, never a traceback."""

from __future__ import annotations

import socket

import pytest

from pipelines.runner import pipeline_main


def test_a_metrics_port_taken_by_another_process_is_one_line_and_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert pipeline_main(["telemetry", "--metrics-port", str(port)]) == 1
    said = capsys.readouterr().err
    assert "Traceback" not in said
    assert (
        f"timestone pipeline telemetry: --metrics-port {port}: cannot serve /metrics on 127.0.0.1:{port}"
        in said
    )


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_metrics_port_that_is_no_port_is_a_wrong_command_line(port, capsys):
    with pytest.raises(SystemExit) as exited:
        pipeline_main(["telemetry", "--metrics-port", port])
    assert exited.value.code == 2
    assert "--metrics-port: " in capsys.readouterr().err
