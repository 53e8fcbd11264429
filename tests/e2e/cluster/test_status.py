"""``timestone cluster status`` against a real etcd and real broker processes: what an operator reads."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, close_all
from tests.e2e.cluster.conftest import EtcdTarget

TTL = 2


def status(etcd: EtcdTarget, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pipelines.cli", "cluster", "status", *etcd.status_options()]
    return subprocess.run([*command, *options], capture_output=True, text=True, timeout=60)


def wait_for_status(etcd: EtcdTarget, condition: Callable[[dict], bool], timeout_s: float = 20) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = status(etcd, "--json")
        document = json.loads(answer.stdout) if answer.stdout else {}
        if answer.returncode == 0 and condition(document):
            return document
        if time.monotonic() > deadline:
            raise AssertionError(f"status never matched: {answer.stdout}{answer.stderr}")
        time.sleep(0.2)


def row_of(text: str, partition: int) -> list[str]:
    """The cells of a partition's line in the readable output."""
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == str(partition) and len(cells) >= 5:
            return cells
    raise AssertionError(f"no line for partition {partition} in:\n{text}")


def test_status_shows_members_leaders_epochs_in_sync_sets_and_lag(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    b1 = cluster_brokers("b1", lease_ttl_s=TTL, partitions=4, replication_factor=2, min_insync_replicas=1)
    wait_for_status(etcd, lambda d: len(d["states"]) == 4)  # created by b1 alone: b1 leads everything
    b2 = cluster_brokers("b2", lease_ttl_s=TTL, partitions=4, replication_factor=2, min_insync_replicas=1)
    wait_for_status(etcd, lambda d: all(s["replicas"] == ["b1", "b2"] for s in d["states"]))

    topic = "plant/meter-7/energy"
    partition = partition_of(topic, 4)
    publisher = PahoClient(b1.port, "meter-7")
    for number in range(3):
        publisher.publish(topic, f"reading {number}".encode(), 1)
    publisher.disconnect()
    close_all()

    answer = status(etcd)
    assert answer.returncode == 0, answer.stderr
    text = answer.stdout
    assert text.splitlines()[0] == (
        f"cluster {etcd.prefix} on {etcd.url}: 2 members live, 4 partitions, controller b1"
    )
    # node, state, mqtt, offsets API, then the partitions it leads, holds and is in sync for
    member_row = r"^\s+{node}\s+live\s+127\.0\.0\.1:{mqtt}\s+http://127\.0\.0\.1:{api}\s+\d+\s+4\s+\d+$"
    assert re.search(member_row.format(node="b1", mqtt=b1.port, api=b1.offsets_port), text, re.M), text
    assert re.search(member_row.format(node="b2", mqtt=b2.port, api=b2.offsets_port), text, re.M), text
    # b2 replicates b1's logs: once it is in sync, every row shows it with no lag
    document = wait_for_status(
        etcd,
        lambda d: all(
            s["isr"] in (["b1", "b2"], ["b2", "b1"]) and s["lag"] == {"b1": 0, "b2": 0} for s in d["states"]
        ),
    )
    state = next(s for s in document["states"] if s["partition"] == partition)
    assert state["leader"] in ("b1", "b2") and state["replicas"] == ["b1", "b2"]
    text = status(etcd).stdout
    cells = row_of(text, partition)
    # partition, leader, epoch, replicas, in sync, then each replica's lag
    assert cells[:4] == [str(partition), state["leader"], str(state["epoch"]), "b1,b2"]
    assert sorted(cells[4].split(",")) == ["b1", "b2"]
    assert cells[5:] == ["b1:0", "b2:0"]

    summary = document["summary"]
    assert sum(int(summary[node]["leaders"]) for node in ("b1", "b2")) == 4
    assert summary["b1"]["replicas"] == summary["b2"]["replicas"] == 4

    b2.kill()  # a member gone: it leaves the replicas of every partition b1 leads, within a lease TTL
    document = wait_for_status(
        etcd,
        lambda d: (
            [m["node_id"] for m in d["members"]] == ["b1"]
            and all(s["replicas"] == ["b1"] for s in d["states"])
        ),
        TTL + 5,
    )
    assert document["down"] == [] and "b2" not in document["summary"]
    assert "1 members live" in status(etcd).stdout.splitlines()[0]

    # a partition left offline names members that are gone (a returning one may lead it): marked DOWN
    offline = {"partition": partition, "leader": None, "epoch": state["epoch"] + 9, "replicas": ["b1", "b2"]}
    etcd.server.put(f"{etcd.prefix}/partitions/{partition}", json.dumps({**offline, "isr": ["b2"]}).encode())
    document = wait_for_status(etcd, lambda d: d["down"] == ["b2"], 10)
    assert document["summary"]["b2"]["live"] is False
    text = status(etcd).stdout
    assert "1 members live, 1 DOWN (b2)" in text.splitlines()[0]
    assert re.search(r"^\s+b2\s+DOWN\s+-\s+-\s+\d+\s+1\s+\d+$", text, re.M), text
    assert "b2(DOWN)" in row_of(text, partition)[3]
    assert row_of(text, partition)[5:] == ["b1:?", "b2:?"]
    assert "DOWN: named by a partition but not a live member" in text  # the legend

    # the etcd and prefix of a broker's own config; `| head` ends quietly
    from_config = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "cluster",
            "status",
            "--config",
            str(b1.config_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert from_config.returncode == 0, from_config.stderr
    assert json.loads(from_config.stdout)["prefix"] == etcd.prefix
    command = [sys.executable, "-m", "pipelines.cli", "cluster", "status", *etcd.status_options()]
    reader_gone = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert reader_gone.stdout is not None
    reader_gone.stdout.close()  # as `| head` does once it has its lines, here before the first one
    _, errors = reader_gone.communicate(timeout=60)
    assert reader_gone.returncode == 0 and "BrokenPipe" not in errors and "Traceback" not in errors, errors


def test_status_of_an_empty_prefix_and_of_an_unreachable_etcd(etcd: EtcdTarget) -> None:
    answer = status(etcd)
    assert answer.returncode == 1
    assert answer.stdout.strip() == f"no cluster under {etcd.prefix} on {etcd.url}"
    command = [sys.executable, "-m", "pipelines.cli", "cluster", "status", "--etcd", "http://127.0.0.1:1"]
    unreachable = subprocess.run([*command, "--timeout", "0.5"], capture_output=True, text=True, timeout=60)
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith("timestone cluster status: etcd http://127.0.0.1:1")
    bad = subprocess.run([*command[:-1], "127.0.0.1:2379"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "--etcd: expected https://host:port" in bad.stderr


def test_status_over_tls_says_what_is_missing_in_one_line(etcd: EtcdTarget) -> None:
    """The shared etcd asks for TLS and a client certificate: without the CA the command refuses before
    connecting; without the client certificate the refused handshake is one line saying what to give,
    with none of gRPC's own log lines beside it."""
    tls = etcd.server.tls
    assert tls is not None and etcd.url.startswith("https://")
    command = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "cluster",
        "status",
        "--etcd",
        etcd.url,
        "--timeout",
        "2",
    ]
    no_ca = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert no_ca.returncode == 2
    assert no_ca.stderr == (
        f"timestone cluster status: --etcd {etcd.url}: an https:// etcd needs --etcd-cacert (the CA that "
        "signed its certificate), and --etcd-cert/--etcd-key when it asks for client certificates\n"
    )
    cert_alone = subprocess.run(
        [*command, "--etcd-cert", str(tls.certfile)], capture_output=True, text=True, timeout=60
    )
    assert (
        cert_alone.returncode == 2 and "--etcd-cert and --etcd-key go with --etcd-cacert" in cert_alone.stderr
    )
    no_client_cert = subprocess.run(
        [*command, "--etcd-cacert", tls.cafile], capture_output=True, text=True, timeout=60
    )
    assert no_client_cert.returncode == 1
    [line] = no_client_cert.stderr.splitlines()
    assert line.startswith(f"timestone cluster status: etcd {etcd.url}")
    assert line.endswith(
        "(over TLS: does etcd ask for a client certificate? give --etcd-cert and --etcd-key)"
    )


def test_status_from_a_broker_config_needs_only_its_etcd_settings(etcd: EtcdTarget, tmp_path: Path) -> None:
    """``cluster status --config`` on an operator's machine, where the broker's password file, ACL and
    listener certificate are not (they live on the broker): only the cluster's etcd settings are read."""
    import yaml

    from tests.harness.local_cluster import cluster_section

    config = tmp_path / "broker.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "auth": {"password_file": str(tmp_path / "absent" / "passwd")},
                "acl": {"file": str(tmp_path / "absent" / "acl")},
                "cluster": cluster_section(etcd, "b1"),
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "cluster", "status", "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stderr == "", done.stderr  # etcd read: no member there (status 1)
    assert json.loads(done.stdout)["prefix"] == etcd.prefix
