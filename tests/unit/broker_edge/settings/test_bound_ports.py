"""Every socket a broker binds has its own port: two on one port of overlapping hosts are refused at load,
naming both keys; port 0, other addresses of the same port, and endpoints switched off never clash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.process.sockets import hosts_overlap
from broker_edge.settings.broker import BrokerConfig

CLUSTER = {"node_id": "b1", "etcd": ["http://127.0.0.1:2379"]}
TLS = {"certfile": "hub.pem", "keyfile": "hub.key", "cafile": "ca.pem"}


def load(document: dict[str, Any]) -> BrokerConfig:
    return load_dataclass(BrokerConfig, document)


def refusal(document: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        load(document)
    return str(caught.value)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"listeners": [{"name": "a", "port": 9883}]},
            "admin_http.port: port 9883 on 127.0.0.1 is already listeners[0].port (on 127.0.0.1)",
        ),
        (
            {
                "listeners": [
                    {"name": "a", "port": 1883},
                    {"name": "b", "host": "0.0.0.0", "port": 1883, "allow_anonymous": True},
                ]
            },
            "listeners[1].port: port 1883 on 0.0.0.0 is already listeners[0].port",
        ),
        (
            {"offsets_api": {"port": 7000}, "admin_http": {"port": 7000}},
            "admin_http.port: port 7000 on 127.0.0.1 is already offsets_api.port",
        ),
        (  # the members' endpoint binds the offsets API's host unless it names its own
            {"cluster": {**CLUSTER, "listen": {"port": 9884}}},
            "cluster.listen.port: port 9884 on 127.0.0.1 is already offsets_api.port",
        ),
        (
            {"listeners": [{"name": "a", "host": "", "port": 9884, "allow_anonymous": True}]},
            "offsets_api.port: port 9884 on 127.0.0.1 is already listeners[0].port (on every interface)",
        ),
    ],
)
def test_two_endpoints_on_one_port_are_refused_naming_both(document, message) -> None:
    assert message in refusal(document)


@pytest.mark.parametrize(
    "document",
    [
        {"listeners": [{"name": "a", "port": 0}, {"name": "b", "port": 0}], "admin_http": {"port": 0}},
        {"listeners": [{"name": "a", "port": 9883}], "admin_http": {"enabled": False}},
        {"listeners": [{"name": "a", "port": 9884}], "storage": {"enabled": False}},  # no offsets API then
        {"listeners": [{"name": "a", "port": 1883}, {"name": "b", "host": "127.0.0.2", "port": 1883}]},
        {"listeners": [{"name": "a", "host": "::1", "port": 1883}, {"name": "b", "port": 1883}]},
    ],
)
def test_free_ports_other_addresses_and_endpoints_switched_off_load(document) -> None:
    load(document)


@pytest.mark.parametrize(
    ("first", "second", "overlap"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "127.0.0.2", False),
        ("0.0.0.0", "10.0.0.5", True),
        ("0.0.0.0", "localhost", True),  # a name may resolve to an IPv4 address
        ("0.0.0.0", "::1", False),  # IPv6 sockets are IPv6 only
        ("::", "::1", True),
        ("::", "0.0.0.0", False),
        ("", "::1", True),
        ("localhost", "127.0.0.1", True),
        ("localhost", "::1", True),
        ("localhost", "::", True),
        ("localhost", "127.0.0.2", False),
        ("broker.local", "broker.local", True),
        ("broker.local", "127.0.0.1", False),
    ],
)
def test_hosts_overlap_where_one_port_would_clash(first, second, overlap) -> None:
    assert hosts_overlap(first, second) is overlap
    assert hosts_overlap(second, first) is overlap


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"listeners": [{"host": "0.0.0.0:8883", "port": 8883, "allow_anonymous": True}]},
            "listeners[0].host: not an address or host name ('0.0.0.0:8883'; give the port in port)",
        ),
        (
            {"listeners": [{"name": "a"}, {"name": "b", "host": "[::1]", "port": 1884}]},
            "listeners[1].host: not an address or host name ('[::1]')",
        ),
        (
            {"listeners": [{"host": "broker .local", "allow_anonymous": True}]},
            "listeners[0].host: not an address or host name ('broker .local')",
        ),
        (
            {"offsets_api": {"host": "127.0.0.1:9884"}},
            "offsets_api.host: not an address or host name ('127.0.0.1:9884'; give the port in port)",
        ),
        (
            {"admin_http": {"host": "http://127.0.0.1"}},
            "admin_http.host: not an address or host name ('http://127.0.0.1')",
        ),
        (
            {"uplink_hub": {"tls": TLS, "host": "hub.example.com:9886"}},
            "uplink_hub.host: not an address or host name ('hub.example.com:9886'; give the port in port)",
        ),
        (
            {"cluster": {**CLUSTER, "listen": {"host": "127.0.0.1:9885"}}},
            "cluster.listen.host: not an address or host name ('127.0.0.1:9885'; give the port in port)",
        ),
    ],
)
def test_a_host_that_is_no_address_nor_host_name_is_refused_naming_its_key(document, message) -> None:
    assert refusal(document) == message


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "", "127.0.0.1", "::1", "10.0.0.5", "localhost", "b1.plant.example", "edge."]
)
def test_the_documented_host_forms_load(host: str) -> None:
    config = load(
        {
            "listeners": [{"host": host, "allow_anonymous": True}],
            "offsets_api": {"host": host, "token": "s3cret-token-of-a-reader"},
            "uplink_hub": {"tls": TLS, "host": host},
        }
    )
    assert config.listeners[0].host == config.offsets_api.host == host
    if host:  # the admin endpoint alone refuses an empty host, as it always did
        assert load({"admin_http": {"host": host}}).admin_http.host == host


def test_broker_check_refuses_a_host_with_its_port(tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text('listeners: [{host: "0.0.0.0:8883", port: 8883, allow_anonymous: true}]\n')
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "listeners[0].host: not an address or host name ('0.0.0.0:8883'; give the port in port)" in (
        result.stderr
    )


def test_an_offsets_api_off_loopback_without_a_token_names_every_way_to_give_one() -> None:
    """The refusal named ``token`` alone, where ``tokens`` and ``tokens_file`` do as well."""
    with pytest.raises(ConfigError) as refused:
        load_dataclass(BrokerConfig, {"offsets_api": {"host": "0.0.0.0"}})
    assert str(refused.value) == (
        "offsets_api.token: required (or tokens, or tokens_file) when the offsets API listens on "
        "non-loopback '0.0.0.0'"
    )
