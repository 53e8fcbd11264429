"""Without the optional dependencies: the broker still serves (Arrow fetches refused with the extra to
install), and the pipeline commands say which extra they need instead of a traceback.

Each test runs a real process in which the missing packages are made unimportable (`sys.modules[name] =
None` makes `import name` fail as if it were not installed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from broker_edge.runtime.launcher import free_port, wait_for_port
from tests.e2e.broker_clients import PahoClient

REPO = Path(__file__).resolve().parents[3]


def without(modules: list[str], call: str) -> list[str]:
    """A `python -c` command running `call` with `modules` unimportable."""
    hide = "; ".join(f"sys.modules[{name!r}] = None" for name in modules)
    return [sys.executable, "-c", f"import sys; {hide}; from pipelines.cli import main; sys.exit({call})"]


def test_broker_without_pyarrow_serves_jsonl_and_names_the_extra_for_arrow(tmp_path):
    port, offsets_port = free_port(), free_port()
    config = tmp_path / "broker.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listeners": [{"port": port}],
                "storage": {"directory": str(tmp_path / "data")},
                "offsets_api": {"port": offsets_port},
                "admin_http": {"port": 0},
            }
        )
    )
    command = without(["pyarrow", "numpy"], f"main(['broker', '--config', {str(config)!r}])")
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(offsets_port)
        publisher = PahoClient(port, "meter-1")
        publisher.publish("meter", b"42", 1)
        publisher.disconnect()
        url = f"http://127.0.0.1:{offsets_port}/v1/logs/meter/records"
        with urllib.request.urlopen(url + "?offset=0&format=jsonl") as answer:
            lines = [json.loads(line) for line in answer.read().splitlines()]
        try:
            urllib.request.urlopen(url + "?offset=0")  # Arrow is the default format
            refused = None
        except urllib.error.HTTPError as error:
            refused = error
    finally:
        process.terminate()
        process.wait(timeout=15)

    assert [line["payload_text"] for line in lines] == ["42"]
    assert refused is not None and refused.code == 501
    body = json.loads(refused.read())
    assert body["error"] == "format_unavailable"
    assert "pip install 'timestone[arrow]'" in body["message"]
    assert process.returncode == 0  # a clean stop: nothing failed along the way


def test_pipeline_command_without_the_extras_says_what_to_install():
    done = subprocess.run(
        without(["pyspark", "deltalake"], "main(['pipeline', 'telemetry'])"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 3
    assert "Traceback" not in done.stderr
    assert (
        "timestone pipeline: this command needs the optional dependencies of timestone[pipelines,spark]"
        in (done.stderr)
    )
    assert "pip install 'timestone[pipelines,spark]'" in done.stderr


def test_ota_command_without_the_extras_names_the_pipelines_extra():
    done = subprocess.run(
        without(["deltalake", "pyarrow", "pandas"], "main(['ota', 'status'])"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 3
    assert "pip install 'timestone[pipelines]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_command_whose_extras_lack_the_missing_module_names_the_extra_that_brings_it():
    """``timestone ota status`` with the pipelines extra but no Spark said to install timestone[pipelines],
    which was installed and brings no pyspark: the advice led back to the same message."""
    done = subprocess.run(
        without(["pyspark"], "main(['ota', 'status'])"), cwd=REPO, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 3
    assert done.stderr.startswith(
        "timestone ota: this command needs the optional dependencies of timestone[pipelines,spark] "
        "(pyspark is not installed)"
    )
    assert "pip install 'timestone[pipelines,spark]'" in done.stderr


def _broker_config(tmp_path: Path, cluster: bool) -> Path:
    """A broker on a fixed free port; with ``cluster``, a member of a cluster on an etcd that is not there."""
    document: dict = {
        "listeners": [{"host": "127.0.0.1", "port": free_port()}],
        "storage": {"directory": str(tmp_path / "data")},
        "offsets_api": {"port": 0},
        "admin_http": {"port": 0},
    }
    if cluster:
        document["cluster"] = {"node_id": "b1", "etcd": [f"http://127.0.0.1:{free_port()}"]}
    config = tmp_path / ("member.yaml" if cluster else "broker.yaml")
    config.write_text(yaml.safe_dump(document))
    return config


def test_a_cluster_member_without_the_cluster_extra_names_it_before_it_listens(tmp_path):
    """A ``cluster:`` section, or ``--workers`` (whose members form a cluster), needs the etcd client of the
    cluster extra. A start without it served its listener, then exited 3 as it joined, and ``--check`` said
    the configuration was OK; each now says which extra to install, before anything is bound or made."""
    member, alone = _broker_config(tmp_path, cluster=True), _broker_config(tmp_path, cluster=False)
    commands = [
        ["broker", "--check", "--config", str(member)],
        ["broker", "--config", str(member)],
        ["broker", "--workers", "2", "--check", "--config", str(alone)],
        ["broker", "--workers", "2", "--config", str(alone)],
    ]
    for command in commands:
        done = subprocess.run(
            without(["aetcd", "grpc"], f"main({command!r})"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        said = done.stdout + done.stderr
        assert done.returncode == 3, (command, said)
        assert "timestone broker: this command needs the optional dependencies of timestone[cluster]" in said
        assert "pip install 'timestone[cluster]'" in said
        assert "Traceback" not in said and "listening" not in said and "configuration OK" not in said
        assert not (tmp_path / "data").exists(), command  # nothing made: no data directory, no etcd
