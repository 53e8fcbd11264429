"""The broker's OCI image (conf/container/): built by conf/container/build from Debian packages (mmdebstrap)
and the project's wheels with podman, nothing pulled from a registry, then started as an orchestrator starts
it (its configuration and secrets mounted, a data volume): it answers MQTT with the mounted password file,
/health on its admin port, and stops cleanly on SIGTERM. Where no builder can run (no podman or mmdebstrap,
not root) the test is skipped and says why."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from broker_edge.runtime.launcher import free_port
from pipelines.cli import main
from tests.e2e.broker_clients import PahoClient, wait_for

ROOT = Path(__file__).resolve().parents[3]
TAG = "localhost/timestone-broker:test"
MISSING = [tool for tool in ("podman", "mmdebstrap") if shutil.which(tool) is None]

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(bool(MISSING), reason=f"no image builder here: {', '.join(MISSING)} not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="building a root filesystem with mmdebstrap needs root"),
]


def runtime_options() -> list[str]:
    """Options that let containers start where the host forbids what podman does by default: runc where
    installed (crun refuses hybrid cgroups), and the limits this process has (raising one needs
    CAP_SYS_RESOURCE, which a sandboxed root may lack). Harmless elsewhere."""
    options = ["--runtime", "runc"] if shutil.which("runc") else []
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    processes = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    return [*options, "--ulimit", f"nofile={files}:{files}", "--ulimit", f"nproc={processes}:{processes}"]


def podman(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *arguments], capture_output=True, text=True, timeout=timeout)


def test_the_image_builds_from_debian_packages_and_serves_mqtt_and_health(
    tmp_path: Path, project_wheels: Path
) -> None:
    options = " ".join(runtime_options())
    env = dict(os.environ, PYTHON=sys.executable, PODMAN_BUILD_OPTIONS=options, WHEELS=str(project_wheels))
    built = subprocess.run(
        [str(ROOT / "conf" / "container" / "build"), TAG],
        capture_output=True,
        text=True,
        env=env,
        timeout=840,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert built.stdout.strip() == TAG
    history = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", TAG).stdout
    assert "pip install --quiet --no-index" in history  # the wheels made here, no index reached
    client = podman(
        "run", "--rm", *runtime_options(), "--entrypoint", "/opt/timestone/bin/python", TAG,
        "-c", "import aetcd, grpc; print('etcd client', aetcd.__name__, grpc.__version__)",
    )  # fmt: skip
    assert client.returncode == 0 and "etcd client aetcd" in client.stdout, client.stderr  # a hub member's

    config = tmp_path / "etc"
    (config / "secrets").mkdir(parents=True)
    assert main(["passwd", "-c", str(config / "secrets" / "passwd"), "device-1", "--password", "s3cret"]) == 0
    (config / "secrets" / "tokens.yaml").write_text(
        yaml.safe_dump({"tokens": [{"name": "spark", "token": "t" * 32}]})
    )
    mqtt_port, admin_port, api_port = free_port(), free_port(), free_port()
    image_config = yaml.safe_load((ROOT / "conf" / "container" / "broker.yaml").read_text())
    image_config["listeners"][0]["port"] = mqtt_port  # the host's network: ports of the test's own
    image_config["admin_http"]["port"] = admin_port
    image_config["offsets_api"]["port"] = api_port
    (config / "broker.yaml").write_text(yaml.safe_dump(image_config))
    for path in [config, *config.rglob("*")]:
        os.chown(path, 999, 999)
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 999, 999)
    name = f"timestone-test-{os.getpid()}"
    started = podman(
        "run", "--detach", "--name", name, "--network", "host", *runtime_options(),
        "--volume", f"{config}:/etc/timestone:ro", "--volume", f"{data}:/var/lib/timestone", TAG,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:

        def health() -> dict | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/health", timeout=2) as answer:
                    return json.load(answer)
            except OSError:
                return None

        assert wait_for(lambda: health() is not None, timeout=60), podman("logs", name).stdout[-3000:]
        answer = health()
        assert answer is not None and answer["status"] == "ok"
        device = PahoClient(mqtt_port, client_id="device-1", username="device-1", password="s3cret")
        device.subscribe("plant/#", qos=1)
        device.publish("plant/1/temp", b"21.5", qos=1)
        assert device.expect()[0].payload == b"21.5"
        device.disconnect()
        refused = PahoClient(mqtt_port, username="device-1", password="wrong", connect=False)
        assert refused.connect()[1].is_failure
        refused.close()
    finally:
        stopped = podman("stop", "--time", "30", name)
        exit_code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        logs = podman("logs", name)
        podman("rm", "--force", name)
    assert stopped.returncode == 0 and exit_code == "0", logs.stdout[-2000:] + logs.stderr[-2000:]
    assert "broker stopped" in logs.stdout + logs.stderr
    assert (data / "meta").is_dir() and (data / ".lock").exists()  # the data lived on the mounted volume
