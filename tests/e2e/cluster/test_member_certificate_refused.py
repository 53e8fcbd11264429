"""A member certificate naming another node (``cluster.tls.certfile`` of n1 on node n2) is refused by
``timestone broker --check`` as by a start, and the start refuses it before it makes or locks its data
directory: ``--check`` passed it, and the start said it only after ``data/.lock`` and ``data/log/`` were
made."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from broker_edge.runtime.local_pki import LocalPki

pytestmark = pytest.mark.timeout(60)

EXPECTED = (
    "configuration error: cluster.tls.certfile: must name this node as its one URI subject alternative name "
    "'timestone://node/n2', names 'n1'"
)


def broker(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pipelines.cli", "broker", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_a_member_certificate_of_another_node_is_refused_by_check_and_before_the_data_directory(
    tmp_path: Path,
) -> None:
    pki = LocalPki(tmp_path / "pki")
    n1 = pki.member("n1")
    cluster = {
        "node_id": "n2",
        "etcd": ["http://127.0.0.1:1"],  # never reached: the certificate is refused first
        "tls": {"certfile": str(n1.cert), "keyfile": str(n1.key), "cafile": str(pki.ca.cert)},
    }
    data = tmp_path / "data"
    config = tmp_path / "broker.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "cluster": cluster,
                "storage": {"directory": str(data)},
                "listeners": [{"name": "mqtt", "type": "tcp", "host": "127.0.0.1", "port": 0}],
                "admin_http": {"port": 0},
                "offsets_api": {"port": 0},
            }
        )
    )
    for arguments in (("--check", "--config", str(config)), ("--config", str(config))):
        done = broker(tmp_path, *arguments)
        assert done.returncode == 2, done.stdout + done.stderr
        assert EXPECTED in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert not data.exists(), sorted(str(path) for path in data.rglob("*"))
