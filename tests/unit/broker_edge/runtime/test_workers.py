"""What ``timestone broker --workers N`` makes of a configuration: each member's, and the refusals."""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.runtime.workers_config import member_documents
from broker_edge.settings.broker import BrokerConfig

ETCD = "http://127.0.0.1:23790"


def members(document: dict[str, Any], workers: int = 3) -> list[tuple[str, BrokerConfig]]:
    config = load_dataclass(BrokerConfig, document)
    return [
        (node, load_dataclass(BrokerConfig, member))
        for node, member in member_documents(
            document, config, workers, ETCD if config.cluster is None else None
        )
    ]


def test_every_member_shares_the_listeners_and_has_its_own_data_and_side_ports():
    document = {
        "listeners": [{"name": "plain", "port": 1883}, {"name": "ws", "type": "websocket", "port": 8083}],
        "storage": {"directory": "/srv/timestone"},
        "offsets_api": {"port": 9884},
        "admin_http": {"port": 9883},
    }
    made = members(document)
    assert [node for node, _ in made] == ["w0", "w1", "w2"]
    for index, (node, config) in enumerate(made):
        assert [(listener.name, listener.port, listener.reuse_port) for listener in config.listeners] == [
            (node, 0, False),  # its own address: the one the cluster advertises for it
            ("plain", 1883, True),
            ("ws", 8083, True),
        ]
        assert config.storage.directory == f"/srv/timestone/workers/{node}"
        assert (config.offsets_api.port, config.admin_http.port) == ((9884, 9883) if index == 0 else (0, 0))
        cluster = config.cluster
        assert cluster is not None
        assert (cluster.node_id, cluster.etcd, cluster.replication_factor) == (node, [ETCD], 1)
        assert (cluster.min_insync_replicas, cluster.listen.host, cluster.listen.port) == (1, "127.0.0.1", 0)
        assert not cluster.redirect_publishers  # devices ignoring a Server Reference would be disconnected
    assert "cluster" not in document  # the configuration given is left as it was


def test_a_configured_cluster_is_joined_by_each_member_under_a_name_of_its_own():
    document = {
        "cluster": {
            "node_id": "plant",
            "etcd": ["http://127.0.0.1:2379"],
            "replication_factor": 2,
            "advertise": {"mqtt": "10.0.0.5:1883", "offsets_api": "http://127.0.0.1:9884"},
        }
    }
    made = members(document, 2)
    assert [node for node, _ in made] == ["plant-0", "plant-1"]
    for _, config in made:
        cluster = config.cluster
        assert cluster is not None
        assert (cluster.replication_factor, cluster.etcd) == (2, ["http://127.0.0.1:2379"])
        assert cluster.advertise.mqtt is None  # each member's own, from what it binds
        assert cluster.advertise.offsets_api is None


def test_members_proving_who_they_are_each_read_a_certificate_of_their_own():
    """A member certificate names one node: member n of node ``plant`` reads the files named as the ones
    configured with ``-n`` before the suffix, the names ``timestone pki issue member plant-n`` gives them."""
    tls = {"certfile": "/etc/tls/member-plant.pem", "keyfile": "/etc/tls/member-plant.key"}
    document: dict[str, Any] = {
        "cluster": {
            "node_id": "plant",
            "etcd": ["http://127.0.0.1:2379"],
            "tls": {**tls, "cafile": "/etc/tls/ca.pem", "min_version": "TLSv1.2"},
        }
    }
    made = members(document, 2)
    for index, (node, config) in enumerate(made):
        member_tls = config.cluster.tls if config.cluster is not None else None
        assert member_tls is not None
        assert (member_tls.certfile, member_tls.keyfile) == (
            f"/etc/tls/member-{node}.pem",
            f"/etc/tls/member-plant-{index}.key",
        )
        assert (member_tls.cafile, member_tls.min_version) == ("/etc/tls/ca.pem", "TLSv1.2")
    assert document["cluster"]["tls"]["certfile"] == tls["certfile"]  # the configuration given as it was


def test_members_listening_on_every_interface_have_no_address_of_their_own_to_send_devices_to():
    made = members({"listeners": [{"host": "0.0.0.0", "port": 1883}], "auth": {"allow_anonymous": True}})
    for _, config in made:
        assert [listener.port for listener in config.listeners] == [1883]
        assert config.cluster is not None and not config.cluster.redirect_publishers
        host, port = config.cluster.advertise.mqtt.rsplit(":", 1)  # the shared listener, by the host's name
        assert port == "1883" and host in (socket.getfqdn(), socket.gethostname())


def test_members_listening_on_every_interface_never_advertise_a_loopback_name():
    """Where the host's name maps to 127.0.0.1 beside localhost (/etc/hosts of many containers), the
    host's canonical name is 'localhost': a fenced member sent its MQTT 5 clients to their own localhost."""
    made = members({"listeners": [{"host": "0.0.0.0", "port": 1883}], "auth": {"allow_anonymous": True}})
    for _, config in made:
        assert config.cluster is not None and config.cluster.advertise.mqtt is not None
        host = config.cluster.advertise.mqtt.rsplit(":", 1)[0]
        assert host.split(".")[0] != "localhost", host


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"listeners": [{"port": 0}]}, "listeners[0].port"),
        ({"storage": {"enabled": False}}, "storage.enabled"),
        ({"offsets_api": {"enabled": False}}, "offsets_api.enabled"),
        # each member's address is the one it binds: every interface names none (the start refused it
        # after starting etcd, under a cluster.advertise.offsets_api the file given cannot hold)
        ({"offsets_api": {"host": "0.0.0.0", "token": "t0k3n"}}, "offsets_api.host"),
        # a member's own listener bears its name: the start refused the duplicate after starting etcd
        ({"listeners": [{"name": "plain", "port": 1883}, {"name": "w1", "port": 1884}]}, "listeners[1].name"),
    ],
)
def test_what_cannot_run_as_workers_is_refused_naming_the_field(document: dict[str, Any], field: str):
    with pytest.raises(ConfigError, match="^" + re.escape(field) + ": "):
        members(document)


def test_fewer_members_than_the_data_holds_are_refused_and_as_many_or_more_start(tmp_path):
    """Each member keeps the one copy of the logs of the partitions it leads, their layout kept in the
    command's etcd: with fewer members the others' partitions stayed offline, their logs unread, and
    nothing said so but an INFO line of the controller."""
    from broker_edge.runtime.workers import check_workers

    document: dict[str, Any] = {"storage": {"directory": str(tmp_path)}}
    config = load_dataclass(BrokerConfig, document)
    for node in ("w0", "w1", "w2"):
        (tmp_path / "workers" / node / "log").mkdir(parents=True)
    (tmp_path / "workers" / "w2.yaml").write_text("")  # a member's files beside: not a member's data
    with pytest.raises(ConfigError, match=r"^storage\.directory: .* holds the data of w2, members of an "):
        check_workers(document, config, 2)
    check_workers(document, config, 3)
    check_workers(document, config, 4)
    (tmp_path / "workers" / "w9").mkdir()  # made, never written: no data
    check_workers(document, config, 3)


def test_a_member_configuration_that_would_not_load_is_refused_before_anything_starts():
    """``--check --workers`` said OK to what each member then refused, after the command had started etcd."""
    from broker_edge.runtime.workers import check_workers

    document: dict[str, Any] = {"storage": {"directory": "/nonexistent/timestone"}}
    config = load_dataclass(BrokerConfig, document)
    document["cluster"] = {"node_id": "x"}  # what no member's configuration takes: made into one of each
    with pytest.raises(ConfigError, match=r"^cluster\.etcd: member w0 of --workers: "):
        check_workers(document, config, 2)


@pytest.mark.parametrize("count", ["0", "-3", "100000"])
def test_a_worker_count_out_of_range_is_a_wrong_command_line_naming_the_bound(count, capsys, monkeypatch):
    """A mistyped count (``--workers 1000`` on a small machine) would fork hundreds of brokers: refused
    before anything starts, with the most this machine takes."""
    from broker_edge.runtime.main import MEMBERS_PER_CPU, main

    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0, 1, 2, 3})
    with pytest.raises(SystemExit) as exited:
        main(["--workers", count])
    assert exited.value.code == 2
    most = 4 * MEMBERS_PER_CPU
    assert (
        f"--workers: from 1 to {most} ({MEMBERS_PER_CPU} per CPU this command may run on"
        in capsys.readouterr().err
    )
