"""The production examples of docs/operations.md, started as the doc writes them (``doc_runner``): after
``timestone pki`` issued their files, each serves its clients as the doc says, and nothing of it is mocked."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tests.e2e.operations.doc_runner import ROOT, Block, commands, run_as_written

DOC = ROOT / "docs" / "operations.md"

pytestmark = [
    pytest.mark.timeout(400),
    pytest.mark.skipif(os.geteuid() != 0, reason="the doc's machine is made of namespaces and mounts: root"),
    pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto-clients (.ci/system-deps)"),
]


def test_a_production_broker_starts_as_written_and_serves_devices_and_readers(tmp_path: Path) -> None:
    done = run_as_written(commands(DOC, "broker"), {"edge-7.plant.example": "10.0.0.7"}, tmp_path)
    assert done.returncode == 0, done.output[-4000:]
    lines = done.output.splitlines()
    assert "21.5" in lines  # the device read back what it published, over TLS, with its password
    health = json.loads(next(line for line in lines if line.startswith('{"status"')))
    assert health["status"] == "ok"
    listing = json.loads(next(line for line in lines if line.startswith('{"logs"')))
    assert [log["topic"] for log in listing["logs"]] == ["devices/device-1/temp"]
    (log,) = done.logs.values()
    assert "listening: devices tls on 0.0.0.0:8883 (anonymous refused)" in log
    assert " WARNING " not in log and " ERROR " not in log


CLUSTER_HOSTS = {f"b{n}.plant.example": f"10.0.0.1{n}" for n in (1, 2, 3)}
AS_ETCD = "setpriv --reuid etcd --regid etcd --init-groups "
"""How Debian's etcd-server unit runs etcd (``User=etcd``), which the doc's cluster runs as services."""


def as_services(blocks: list[Block]) -> list[Block]:
    """The doc's cluster on machines set up for its services: ``/etc/timestone`` as the install makes it
    (mode 0750, the timestone group's), each etcd member run as the user Debian's unit runs it as."""
    install = commands(DOC, "install")[1]
    return [install, *(_as_etcd(block) for block in blocks)]


def _as_etcd(block: Block) -> Block:
    """A served etcd member's block run as the etcd user; any other block as it is."""
    if block.serve and block.text.startswith("etcd "):
        return replace(block, text=AS_ETCD + block.text)
    return block


def test_a_cluster_of_three_on_etcd_with_tls_and_auth_starts_as_written(tmp_path: Path) -> None:
    """etcd's key and CA, as the doc issued them (root's key, mode 0600; the CA under /etc/timestone, which
    only the timestone group may enter), were not readable by the etcd user that Debian's unit runs etcd
    as: every member stopped at start with ``open /etc/etcd/tls/b1.key: permission denied``."""
    done = run_as_written(as_services(commands(DOC, "cluster")), CLUSTER_HOSTS, tmp_path, timeout_s=360)
    assert done.returncode == 0, done.output[-5000:]
    lines = done.output.splitlines()
    assert "22.5" in lines  # published on b1, read on b3
    assert any("3 members live, 16 partitions" in line for line in lines)
    assert "root" in lines and "timestone-plant" in lines  # `user list` after auth enable, as root by its CN
    brokers = {command: log for command, log in done.logs.items() if command.startswith("timestone broker")}
    etcds = {command: log for command, log in done.logs.items() if command.startswith(AS_ETCD + "etcd ")}
    assert len(brokers) == 3 and len(etcds) == 3
    for log in brokers.values():
        assert "members' endpoint on port 9885" in log
        alarms = [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line]
        # (a status 403, not those digits inside a lease id such as 5145a240378b8216)
        assert [line for line in alarms if re.search(r"\b403\b", line) or "not_a_member" in line] == []


def test_a_hub_and_a_site_start_as_written_and_the_sites_records_reach_the_hub(tmp_path: Path) -> None:
    hosts = {"hub.example.com": "10.0.0.20", "gw.plant-1.example": "10.0.0.21"}
    done = run_as_written(commands(DOC, "uplink"), hosts, tmp_path)
    assert done.returncode == 0, done.output[-5000:]
    listing = json.loads(next(line for line in done.output.splitlines() if line.startswith('{"logs"')))
    assert [(log["topic"], log["end_offset"]) for log in listing["logs"]] == [
        ("$site/plant-1/devices/device-1/temp", 1)
    ]
    status = done.output[done.output.index("site     connected") :].splitlines()[1].split()
    assert status[:2] == ["plant-1", "yes"]  # `timestone uplink status` on the site
    for log in done.logs.values():
        assert " ERROR " not in log


def test_a_gateway_installs_as_written_with_the_base_install_only(
    tmp_path: Path, project_wheels: Path
) -> None:
    """The wheels a checkout makes (``pip wheel``) stand in for PyPI: the doc's namespaces have no network."""
    environment = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(project_wheels)}
    done = run_as_written(commands(DOC, "install"), {}, tmp_path / "run", environment=environment)
    assert done.returncode == 0, done.output[-4000:]
    assert "timestone 0.1.0" in done.output.splitlines()  # the installed command, not this checkout's
    assert "wrote /etc/timestone/pki/try-ca/ca.pem" in done.output  # `timestone pki` on the base install
    assert "(timestone) gid=" in done.output  # the system user of the units
    installed = {
        p.name.split("-")[0].lower()
        for p in (tmp_path / "run" / "roots" / "upper" / "opt").rglob("*.dist-info")
    }
    assert {"timestone", "cryptography", "aiohttp", "uvloop"} <= installed
    assert not installed & {"pyspark", "pyarrow", "pandas", "deltalake", "aetcd"}  # the Spark side is extras
