"""The ``cluster:`` section: defaults, every check naming its field, and what a cluster node requires."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from broker_edge.cluster.coordination.etcd import ClusterKeys, grpc_target
from broker_edge.config import ConfigError, load_dataclass
from broker_edge.settings.broker import BrokerConfig
from broker_edge.settings.cluster import ClusterConfig, etcd_endpoint


def load(**cluster: Any) -> BrokerConfig:
    section = {"node_id": "b1", "etcd": ["http://127.0.0.1:2379"], **cluster}
    return load_dataclass(BrokerConfig, {"cluster": section})


def test_the_issue_example_loads_with_the_documented_defaults() -> None:
    config = load(
        advertise={"mqtt": "127.0.0.1:1883", "offsets_api": "http://127.0.0.1:9884"},
        replication_factor=3,
        min_insync_replicas=2,
    )
    cluster = config.cluster
    assert cluster is not None
    assert (cluster.node_id, cluster.etcd) == ("b1", ["http://127.0.0.1:2379"])
    assert cluster.advertise.mqtt == "127.0.0.1:1883"
    assert cluster.advertise.offsets_api == "http://127.0.0.1:9884"
    assert (cluster.partitions, cluster.lease_ttl_s, cluster.replica_lag_max_ms) == (16, 3, 5000)
    assert (cluster.unclean_election, cluster.forward_timeout_ms, cluster.key_prefix) == (
        False,
        5000,
        "/timestone",
    )
    assert (cluster.session_save_interval_ms, cluster.session_handover_timeout_ms) == (1000, 5000)
    assert cluster.token is None
    assert cluster.hw_checkpoint_interval_ms == 5000


def test_no_section_means_no_cluster() -> None:
    assert load_dataclass(BrokerConfig, {}).cluster is None


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"min_insync_replicas": 4}, "cluster.min_insync_replicas: must be <= replication_factor (3), got 4"),
        ({"replication_factor": 0}, "cluster.replication_factor: must be an integer >= 1, got 0"),
        ({"lease_ttl_s": 1}, "cluster.lease_ttl_s: must be an integer >= 2, got 1"),
        ({"lease_ttl_s": 9_999_999_999}, "cluster.lease_ttl_s: must be <= 3600 (an hour), got 9999999999"),
        ({"lease_ttl_s": 3601}, "cluster.lease_ttl_s: must be <= 3600 (an hour), got 3601"),
        ({"partitions": 0}, "cluster.partitions: must be an integer >= 1"),
        ({"partitions": 100_000}, "cluster.partitions: must be <= 4096"),
        ({"node_id": "a b"}, "cluster.node_id: must be 1-63 letters"),
        ({"node_id": ""}, "cluster.node_id: must be 1-63 letters"),
        ({"etcd": []}, "cluster.etcd: at least one etcd URL is required"),
        ({"etcd": ["127.0.0.1:2379"]}, "cluster.etcd[0]: expected https://host:port"),
        ({"etcd": ["http://127.0.0.1:1", "ftp://b:2"]}, "cluster.etcd[1]: expected https://host:port"),
        (
            {"etcd": ["http://10.0.0.5:2379"]},
            "cluster.etcd[0]: an etcd beyond loopback is reached over https",
        ),
        ({"etcd": ["https://10.0.0.5:2379"]}, "cluster.etcd_tls: required for https:// etcd URLs"),
        (
            {"etcd": ["http://127.0.0.1:1", "https://10.0.0.5:2"], "etcd_tls": {"cafile": "ca.pem"}},
            "cluster.etcd: mixes http:// and https://",
        ),
        ({"etcd_tls": {"cafile": "ca.pem"}}, "cluster.etcd_tls: set, but the etcd URLs are http://"),
        (
            {"etcd": ["https://10.0.0.5:2379"], "etcd_tls": {"cafile": "ca.pem", "certfile": "c.pem"}},
            "cluster.etcd_tls.keyfile: certfile and keyfile go together",
        ),
        ({"etcd_auth": {"username": "", "password_file": "pw"}}, "cluster.etcd_auth.username: must not be"),
        ({"token": "s3cret"}, "cluster.token: members no longer share a token"),
        (
            {"tls": {"certfile": "m.pem", "keyfile": "m.key", "cafile": "ca.pem", "min_version": "TLSv1.1"}},
            "cluster.tls.min_version: expected TLSv1.2 or TLSv1.3",
        ),
        ({"tls": {"certfile": "m.pem", "keyfile": "m.key"}}, "cluster.tls.cafile: required key is missing"),
        ({"listen": {"host": "10.0.0.5"}}, "cluster.tls: required: the members' endpoint (listen.host"),
        ({"advertise": {"peer": "http://10.0.0.5:9885"}}, "cluster.tls: required: the members' endpoint"),
        ({"listen": {"host": "0.0.0.0"}}, "cluster.advertise.peer: required when the members' endpoint"),
        ({"listen": {"port": 70000}}, "cluster.listen.port: must be between 0 and 65535"),
        ({"key_prefix": "timestone"}, "cluster.key_prefix: must start with '/'"),
        ({"key_prefix": "/t/"}, "cluster.key_prefix: must start with '/'"),
        ({"advertise": {"mqtt": "nohost"}}, "cluster.advertise.mqtt: expected host:port"),
        ({"advertise": {"offsets_api": "127.0.0.1:9884"}}, "cluster.advertise.offsets_api: expected http://"),
        ({"replica_lag_max_ms": True}, "cluster.replica_lag_max_ms: expected int"),
        ({"hw_checkpoint_interval_ms": 0}, "cluster.hw_checkpoint_interval_ms: must be an integer >= 1"),
        ({"session_save_interval_ms": 0}, "cluster.session_save_interval_ms: must be an integer >= 10"),
        ({"session_handover_timeout_ms": 5}, "cluster.session_handover_timeout_ms: must be an integer >= 1"),
        ({"bogus": 1}, "cluster.bogus: unknown key"),
    ],
)
def test_bad_values_name_the_field(cluster: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(**cluster)
    assert str(raised.value).startswith(message)


def test_a_lease_of_an_hour_loads() -> None:
    cluster = load(lease_ttl_s=3600).cluster
    assert cluster is not None and cluster.lease_ttl_s == 3600


def test_node_id_and_etcd_are_required() -> None:
    with pytest.raises(ConfigError, match=r"^cluster\.node_id: required key is missing"):
        load_dataclass(BrokerConfig, {"cluster": {"etcd": ["http://127.0.0.1:2379"]}})
    with pytest.raises(ConfigError, match=r"^cluster\.etcd: required key is missing"):
        load_dataclass(BrokerConfig, {"cluster": {"node_id": "b1"}})


def test_a_cluster_node_needs_its_commitlog_and_offsets_api() -> None:
    section = {"node_id": "b1", "etcd": ["http://127.0.0.1:2379"]}
    with pytest.raises(ConfigError, match=r"^cluster: .*storage\.enabled"):
        load_dataclass(BrokerConfig, {"cluster": section, "storage": {"enabled": False}})
    with pytest.raises(ConfigError, match=r"^cluster: .*offsets_api\.enabled"):
        load_dataclass(BrokerConfig, {"cluster": section, "offsets_api": {"enabled": False}})


def test_advertised_addresses_are_required_for_wildcard_binds() -> None:
    section = {"node_id": "b1", "etcd": ["http://127.0.0.1:2379"]}
    listeners = [{"host": "0.0.0.0", "allow_anonymous": True}]
    with pytest.raises(ConfigError, match=r"^cluster\.advertise\.mqtt: required"):
        load_dataclass(BrokerConfig, {"cluster": section, "listeners": listeners})
    with pytest.raises(ConfigError, match=r"^cluster\.advertise\.offsets_api: required"):
        load_dataclass(BrokerConfig, {"cluster": section, "offsets_api": {"host": "::", "token": "t"}})
    advertised = {**section, "advertise": {"mqtt": "10.0.0.5:1883"}}
    assert load_dataclass(BrokerConfig, {"cluster": advertised, "listeners": listeners}).cluster is not None


def test_members_beyond_loopback_prove_who_they_are_with_tls() -> None:
    tls = {"certfile": "m.pem", "keyfile": "m.key", "cafile": "ca.pem"}
    config = load(
        etcd=["https://10.0.0.5:2379", "https://10.0.0.6:2379"],
        etcd_tls={"cafile": "etcd-ca.pem", "certfile": "etcd.pem", "keyfile": "etcd.key"},
        etcd_auth={"username": "timestone-plant", "password_file": "/etc/timestone/etcd-password"},
        tls=tls,
        listen={"host": "10.0.0.21", "port": 9885},
        advertise={"peer": "https://10.0.0.21:9885"},
    )
    cluster = config.cluster
    assert cluster is not None and cluster.tls is not None and cluster.tls.min_version == "TLSv1.3"
    assert cluster.etcd_auth is not None and cluster.etcd_auth.username == "timestone-plant"
    with pytest.raises(ConfigError, match=r"^cluster\.advertise\.peer: must be https:// with cluster\.tls"):
        load(tls=tls, advertise={"peer": "http://127.0.0.1:9885"})
    assert load().cluster is not None  # loopback, plain: the development setting


def test_direct_construction_checks_too() -> None:
    with pytest.raises(ConfigError, match="min_insync_replicas"):
        ClusterConfig("b1", ["http://127.0.0.1:2379"], replication_factor=1, min_insync_replicas=2)


def test_etcd_urls_become_one_grpc_target() -> None:
    assert etcd_endpoint("http://10.0.0.5:2379") == ("10.0.0.5", 2379)
    assert grpc_target(["http://127.0.0.1:2379"]) == "127.0.0.1:2379"
    assert grpc_target(["http://etcd.local:2379"]) == "etcd.local:2379"
    assert grpc_target(["http://127.0.0.1:1", "http://10.0.0.2:2"]) == "ipv4:127.0.0.1:1,10.0.0.2:2"
    assert grpc_target(["http://[::1]:1", "http://[::1]:2"]) == "ipv6:[::1]:1,[::1]:2"
    assert grpc_target(["http://localhost:1", "http://127.0.0.1:2"]).startswith("ipv4:")


def test_key_layout() -> None:
    keys = ClusterKeys("/t")
    assert (keys.config, keys.controller, keys.member("b1"), keys.partition(3)) == (
        "/t/config",
        "/t/controller",
        "/t/members/b1",
        "/t/partitions/3",
    )
    assert keys.partition_number("/t/partitions/12") == 12
    assert keys.partition_number("/t/partitions/x") is None
    assert keys.partition_number("/t/members/b1") is None


def test_loading_a_config_loads_no_etcd_client() -> None:
    # the single broker's start-up must not pay for gRPC: the section's dataclass lives apart from the client
    code = (
        "from broker_edge.settings.broker import load_broker_config; load_broker_config(); import sys; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aetcd', 'grpc', 'google')))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert output.stdout.strip() == "[]"


def test_the_etcd_password_is_the_first_line_as_an_editor_saved_it(tmp_path):
    """A byte order mark an editor saved first is not part of the password; bytes that are no UTF-8 are a
    file that cannot be read (``OSError``, as a missing one), not a ``UnicodeDecodeError`` nothing expects."""
    from broker_edge.settings.cluster import EtcdAuthConfig

    secret = tmp_path / "etcd-password"
    auth = EtcdAuthConfig(username="timestone", password_file=str(secret))
    secret.write_bytes(b"\xef\xbb\xbfs3cret\r\nsecond line\n")
    assert auth.password() == "s3cret"
    secret.write_bytes(b"caf\xe9\n")
    with pytest.raises(OSError, match="not UTF-8 text"):
        auth.password()
