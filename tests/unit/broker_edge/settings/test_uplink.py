"""The ``uplink:`` and ``uplink_hub:`` sections: defaults, and every check naming its dotted field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.settings.broker import BrokerConfig

TLS = {"certfile": "site.pem", "keyfile": "site.key", "cafile": "ca.pem"}


def site(**uplink: Any) -> BrokerConfig:
    section = {"hubs": ["wss://hub.example.com:9886/v1/uplink"], "site_id": "plant-1", "tls": TLS, **uplink}
    return load_dataclass(BrokerConfig, {"uplink": section})


def hub(**uplink_hub: Any) -> BrokerConfig:
    return load_dataclass(BrokerConfig, {"uplink_hub": {"tls": TLS, **uplink_hub}})


def test_a_site_loads_with_the_documented_defaults() -> None:
    uplink = site().uplink
    assert uplink is not None
    assert (uplink.topics, uplink.compression, uplink.bandwidth_bytes_per_s) == (["#"], "zstd", None)
    assert (uplink.batch_bytes, uplink.max_batches_in_flight, uplink.proxy) == (1_048_576, 4, None)
    assert BrokerConfig().uplink is None and BrokerConfig().uplink_hub is None


def test_a_hub_always_requires_client_certificates() -> None:
    uplink_hub = hub(port=0).uplink_hub
    assert uplink_hub is not None
    assert uplink_hub.tls.require_client_cert is True
    assert (uplink_hub.port, uplink_hub.path, uplink_hub.sites) == (0, "/v1/uplink", None)


def test_a_hub_refuses_require_client_cert_written_false_naming_the_key() -> None:
    """Written false, it was taken as true without a word."""
    with pytest.raises(ConfigError) as refused:
        hub(tls={**TLS, "require_client_cert": False})
    assert str(refused.value) == (
        "uplink_hub.tls.require_client_cert: must be true for a hub (sites are known by their certificates)"
    )
    uplink_hub = hub(tls={**TLS, "require_client_cert": True}).uplink_hub
    assert uplink_hub is not None and uplink_hub.tls.require_client_cert is True


def test_broker_check_names_require_client_cert_written_false_in_a_hub(tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text(
        "uplink_hub:\n  tls: {certfile: a, keyfile: b, cafile: c, require_client_cert: false}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert (
        "uplink_hub.tls.require_client_cert: must be true for a hub (sites are known by their certificates)"
        f" (in {config}, line 2)"
    ) in result.stderr
    assert "Traceback" not in result.stderr


def test_a_hub_serves_each_site_its_own_downlink_or_the_default() -> None:
    uplink_hub = hub(site_downlink={"plant-1": ["actions/groups/line-1"]}).uplink_hub
    assert uplink_hub is not None
    assert uplink_hub.downlink_of("plant-1") == ["actions/groups/line-1"]
    assert uplink_hub.downlink_of("plant-2") == [
        "actions/all",
        "actions/groups/#",
        "actions/buckets/#",
        "actions/devices/#",
    ]


def test_a_hub_with_sites_listed_gives_them_their_own_downlink() -> None:
    uplink_hub = hub(
        sites=["plant-1", "plant-2"], site_downlink={"plant-2": ["actions/groups/line-2"]}
    ).uplink_hub
    assert uplink_hub is not None
    assert uplink_hub.downlink_of("plant-2") == ["actions/groups/line-2"]


def test_a_site_waits_at_most_an_hour_between_dials() -> None:
    uplink = site(reconnect_min_s=3600, reconnect_max_s=3600, heartbeat_s=3600).uplink
    assert uplink is not None and uplink.reconnect_max_s == 3600


@pytest.mark.parametrize(
    ("uplink", "message"),
    [
        ({"hubs": []}, "uplink.hubs: at least one hub address"),
        ({"hubs": ["https://hub:9886/v1/uplink"]}, "uplink.hubs[0]: expected wss://host:port/path"),
        # no path: the hub answered 404 at every dial, and --check said OK
        ({"hubs": ["wss://hub:9886"]}, "uplink.hubs[0]: expected wss://host:port/path, the path the hub's"),
        (
            {"hubs": ["wss://hub:9886/v1/uplink", "wss://hub2/"]},
            "uplink.hubs[1]: expected wss://host:port/path",
        ),
        # the link to the hub goes through an HTTP proxy (CONNECT), as documented; https:// was taken
        (
            {"proxy": "https://proxy:3128"},
            "uplink.proxy: expected http://host:port, got 'https://proxy:3128'",
        ),
        ({"proxy": "socks5://proxy:1080"}, "uplink.proxy: expected http://host:port"),
        ({"site_id": "plant/1"}, "uplink.site_id: letters, digits"),
        ({"site_id": "$plant"}, "uplink.site_id: letters, digits"),
        ({"topics": ["telemetry/#/x"]}, "uplink.topics[0]:"),
        ({"topics": []}, "uplink.topics: at least one topic filter"),
        ({"compression": "lz4"}, "uplink.compression: expected one of 'zstd', 'zlib', 'none'"),
        ({"bandwidth_bytes_per_s": 0}, "uplink.bandwidth_bytes_per_s: must be an integer >= 1 or null"),
        ({"batch_bytes": 0}, "uplink.batch_bytes: must be an integer >= 1"),
        ({"reconnect_min_s": 5, "reconnect_max_s": 1}, "uplink.reconnect_max_s: must be >= reconnect_min_s"),
        ({"reconnect_max_s": 1e300}, "uplink.reconnect_max_s: must be a number within (0, 3600] s"),
        (
            {"reconnect_min_s": 3601, "reconnect_max_s": 7200},
            "uplink.reconnect_min_s: must be a number within (0, 3600] s (an hour), got 3601",
        ),
        ({"reconnect_min_s": 0}, "uplink.reconnect_min_s: must be a number within (0, 3600] s"),
        ({"heartbeat_s": 1e300}, "uplink.heartbeat_s: must be a number within (0, 3600] s"),
        ({"retention_warning_ratio": 1.5}, "uplink.retention_warning_ratio: must be in (0, 1]"),
        ({"tls": {"certfile": "a", "keyfile": "b"}}, "uplink.tls.cafile: required key is missing"),
        ({"bogus": 1}, "uplink.bogus: unknown key"),
    ],
)
def test_bad_site_values_name_the_field(uplink: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        site(**uplink)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("uplink_hub", "message"),
    [
        ({"tls": {"certfile": "a", "keyfile": "b"}}, "uplink_hub.tls.cafile: required"),
        ({"port": 70000}, "uplink_hub.port: must be between 0 and 65535"),
        ({"path": "uplink"}, "uplink_hub.path: must start with '/'"),
        ({"sites": ["ok", "not ok"]}, "uplink_hub.sites[1]: not a site id"),
        ({"max_message_bytes": 0}, "uplink_hub.max_message_bytes: must be an integer >= 1"),
        ({"downlink": ["actions/#/x"]}, "uplink_hub.downlink[0]:"),
        ({"downlink": ["$SYS/#"]}, "uplink_hub.downlink[0]: the hub's '$' topics are its own"),
        ({"site_downlink": {"plant/1": ["actions/all"]}}, "uplink_hub.site_downlink.plant/1: not a site id"),
        ({"site_downlink": {"p1": ["actions/all", "a/+b"]}}, "uplink_hub.site_downlink.p1[1]:"),
        (
            {"sites": ["plant-1"], "site_downlink": {"plant-l": ["actions/all"]}},
            "uplink_hub.site_downlink.plant-l: not a site of uplink_hub.sites (plant-1)",
        ),
        (
            {"sites": [], "site_downlink": {"plant-1": ["actions/all"]}},
            "uplink_hub.site_downlink.plant-1: not a site of uplink_hub.sites (none)",
        ),
    ],
)
def test_bad_hub_values_name_the_field(uplink_hub: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        hub(**uplink_hub)
    assert str(raised.value).startswith(message)


def test_the_uplink_needs_the_commitlog_and_a_site_or_a_hub_may_be_a_cluster() -> None:
    with pytest.raises(ConfigError, match=r"^uplink: the uplink carries the commitlog"):
        load_dataclass(
            BrokerConfig,
            {
                "storage": {"enabled": False},
                "uplink": {"hubs": ["wss://h:1/u"], "site_id": "s", "tls": TLS},
            },
        )
    cluster = {"node_id": "b1", "etcd": ["http://127.0.0.1:2379"]}
    site = load_dataclass(
        BrokerConfig,
        {"uplink": {"hubs": ["wss://h:1/u"], "site_id": "s", "tls": TLS}, "cluster": cluster},
    )
    assert site.uplink is not None and site.cluster is not None
    hub = load_dataclass(BrokerConfig, {"uplink_hub": {"tls": TLS}, "cluster": cluster})
    assert hub.uplink_hub is not None and hub.cluster is not None


def test_the_broker_command_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text(
        "uplink:\n  hubs: [wss://hub:9886/v1/uplink]\n  site_id: a/b\n"
        "  tls: {certfile: a, keyfile: b, cafile: c}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "uplink.site_id" in result.stderr
