"""The actions job reaching brokers over TLS with certificates of our own CA (``timestone pki``): its MQTT
publishes to a ``type: tls`` listener (``brokers[].mqtt_tls``) and its offsets API reads over ``https://``
trust the CA in ``tls.cafile``; without it the broker's certificate is refused, and files that do not load
stop the job at its start naming their key."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.runtime.local_pki import LocalPki
from pipelines.actions.cluster import BrokerKind, probe
from pipelines.actions.config import ActionsConfig
from pipelines.actions.job import _publisher
from sources.options import parse_options, tls_options
from tests.e2e.broker_clients import PahoClient
from tests.e2e.conftest import RunningBroker


@pytest.fixture
def pki(tmp_path: Path) -> LocalPki:
    return LocalPki(tmp_path / "pki", name="plant-ca")


@pytest.fixture
def broker(brokers: Callable[..., RunningBroker], pki: LocalPki) -> RunningBroker:
    """A broker whose devices' listener and offsets API serve TLS with a certificate of ``pki``'s CA."""
    server = pki.server("edge")
    tls = {"certfile": str(server.cert), "keyfile": str(server.key)}
    return brokers(
        listeners=[
            {"name": "plain", "type": "tcp", "host": "127.0.0.1", "port": 0},
            {"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls},
        ],
        offsets_api={"tls": tls},
    )


def actions_config(broker: RunningBroker, **tls: str) -> ActionsConfig:
    endpoint = {
        "name": "edge1",
        "mqtt_host": "127.0.0.1",
        "mqtt_port": broker.port_of("devices"),
        "mqtt_tls": True,
        "offsets_api": f"https://127.0.0.1:{broker.broker.offsets_port}",
    }
    return load_dataclass(ActionsConfig, {"brokers": [endpoint], "cluster": False, "tls": tls or None})


def test_actions_go_out_over_tls_and_the_offsets_api_is_read_over_https(
    broker: RunningBroker, pki: LocalPki
) -> None:
    config = actions_config(broker, cafile=str(pki.ca.cert))
    device = PahoClient(broker.port_of("plain"), "device-7")
    device.subscribe("actions/devices/device-7", 1)

    publisher = _publisher(config, cluster=False)
    try:
        publisher.publish("actions/devices/device-7", b'{"action_id": "a-1"}')
    finally:
        publisher.close()

    assert [m.payload for m in device.expect(1)] == [b'{"action_id": "a-1"}']
    assert probe(config.brokers[0], tls=config.tls) is BrokerKind.STANDALONE  # answered over https
    assert probe(config.brokers[0]) is BrokerKind.DOWN  # the system's CAs do not know ours
    reports = parse_options(
        {"brokers": "edge1=https://127.0.0.1:1", "topics": "#", **tls_options(config.tls)}
    )
    assert reports.tls == config.tls  # the reports stream reads with the same files


def test_without_the_ca_the_brokers_certificate_is_refused(broker: RunningBroker) -> None:
    config = actions_config(broker)

    with pytest.raises(ssl.SSLCertVerificationError):
        _publisher(config, cluster=False)


def test_tls_files_that_do_not_load_stop_the_job_naming_their_key(
    broker: RunningBroker, tmp_path: Path, pki: LocalPki
) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("no certificate\n")

    with pytest.raises(ConfigError, match=r"^tls\.cafile: cannot load CA certificates from .*not\.pem"):
        actions_config(broker, cafile=str(not_pem))
    with pytest.raises(ConfigError, match=r"^tls\.certfile: cannot load certificate and key"):
        actions_config(broker, cafile=str(pki.ca.cert), certfile=str(not_pem))
    with pytest.raises(ConfigError, match=r"^tls\.keyfile: is the key of certfile, which is not set"):
        actions_config(broker, keyfile=str(not_pem))
