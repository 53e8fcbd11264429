"""Certificates issued and rotated with ``timestone pki`` under a running broker process, as an operator does
it (docs/security.md, Certificates): the next server certificate served after SIGHUP while connected devices
stay connected, and a devices' CA replaced with both CAs accepted during the switch."""

from __future__ import annotations

import datetime
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from broker_edge.runtime.launcher import free_port, wait_for_port
from tests.e2e.broker_clients import TIMEOUT, PahoClient, wait_for
from tests.e2e.security.certificate_devices import reissued_pem

pytestmark = pytest.mark.timeout(120)


def pki(directory: Path, *arguments: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "pki", *arguments],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def device_context(directory: Path, device: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(directory / "server-ca" / "ca.pem"))
    context.load_cert_chain(str(directory / f"tls/{device}.pem"), str(directory / f"tls/{device}.key"))
    return context


def served_serial(port: int, context: ssl.SSLContext) -> int:
    """The serial number of the certificate the listener serves a new connection now."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def accepted(port: int, context: ssl.SSLContext) -> bool:
    """Whether a device with this context gets a CONNACK (the broker checks its certificate at the
    handshake; a refused one never reaches CONNECT)."""
    try:
        client = PahoClient(port, tls_context=context)
    except (OSError, TimeoutError, ssl.SSLError):
        return False
    client.disconnect()
    return True


def serial_in(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def start_broker(directory: Path, config: Mapping[str, object]) -> tuple[subprocess.Popen[bytes], Path]:
    """``timestone broker`` on ``config`` (written to ``directory/broker.yaml``), its log ``broker.log``."""
    (directory / "broker.yaml").write_text(yaml.safe_dump(config))
    log = directory / "broker.log"
    with open(log, "wb") as output:
        broker = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "broker", "--config", "broker.yaml"],
            cwd=directory,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    return broker, log


def test_server_and_device_certificates_rotate_under_a_running_broker(tmp_path: Path) -> None:
    pki(tmp_path, "ca", "server-ca")
    pki(tmp_path, "ca", "device-ca")
    server = ("issue", "server", "broker", "--ca", "server-ca", "--dns", "localhost", "--ip", "127.0.0.1")
    pki(tmp_path, *server, "--out", "tls/server")
    pki(tmp_path, "issue", "client", "device-1", "--ca", "device-ca", "--out", "tls/device-1")
    trusted = tmp_path / "tls" / "device-cas.pem"
    trusted.write_bytes((tmp_path / "device-ca" / "ca.pem").read_bytes())
    port = free_port()
    config = {
        "listeners": [
            {
                "name": "devices",
                "type": "tls",
                "host": "127.0.0.1",
                "port": port,
                "tls": {
                    "certfile": "tls/server.pem",
                    "keyfile": "tls/server.key",
                    "cafile": "tls/device-cas.pem",
                    "require_client_cert": True,
                },
            }
        ],
        "storage": {"directory": "data"},
        "offsets_api": {"port": 0},
        "admin_http": {"port": 0},
    }
    broker, log = start_broker(tmp_path, config)
    try:
        wait_for_port(port, alive=broker.poll)
        reloads = 0

        def sighup() -> None:
            nonlocal reloads
            reloads += 1
            broker.send_signal(signal.SIGHUP)
            assert wait_for(lambda: log.read_text().count("listener devices: certificate and CAs") == reloads)

        device_1 = device_context(tmp_path, "device-1")
        first = served_serial(port, device_1)
        assert first == serial_in(tmp_path / "tls" / "server.pem")
        watcher = PahoClient(port, client_id="watcher", tls_context=device_1)
        watcher.subscribe("plant/#", qos=1)

        # the next server certificate: same names, a new key; served to new connections after SIGHUP
        pki(tmp_path, "renew", "tls/server.pem", "--ca", "server-ca")
        assert served_serial(port, device_1) == first  # nothing changes before the broker is told
        sighup()
        assert served_serial(port, device_1) == serial_in(tmp_path / "tls" / "server.pem") != first
        publisher = PahoClient(port, client_id="publisher", tls_context=device_1)
        publisher.publish("plant/1/temp", b"21.5", qos=1)
        assert watcher.expect()[0].payload == b"21.5"  # a connection of before the rotation goes on
        publisher.disconnect()

        # a new devices' CA: trusted beside the old one during the switch, then alone
        pki(tmp_path, "ca", "device-ca-2")
        pki(tmp_path, "issue", "client", "device-2", "--ca", "device-ca-2", "--out", "tls/device-2")
        device_2 = device_context(tmp_path, "device-2")
        assert not accepted(port, device_2)
        trusted.write_bytes(
            (tmp_path / "device-ca" / "ca.pem").read_bytes()
            + (tmp_path / "device-ca-2" / "ca.pem").read_bytes()
        )
        sighup()
        assert accepted(port, device_1) and accepted(port, device_2)
        trusted.write_bytes((tmp_path / "device-ca-2" / "ca.pem").read_bytes())
        sighup()
        assert watcher.disconnects.get(timeout=TIMEOUT) == 0x87  # the old CA's device, connected until then
        assert accepted(port, device_2) and not accepted(port, device_1)

        # a file that does not load keeps the certificate in force
        (tmp_path / "tls" / "server.pem").write_text("not a certificate\n")
        broker.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "listener devices: certificate not reloaded" in log.read_text())
        assert accepted(port, device_2)
    finally:
        broker.terminate()
        assert broker.wait(timeout=20) == 0
    assert "Traceback" not in log.read_text()


def expired_copy(cert: Path, ca: Path, out: Path) -> None:
    """``cert`` as it was a year ago: the same names and key, signed by the CA in ``ca``, expired yesterday
    (a backup restored over the renewed one)."""
    now = datetime.datetime.now(datetime.UTC)
    year_ago, yesterday = now - datetime.timedelta(days=366), now - datetime.timedelta(days=1)
    out.write_bytes(reissued_pem(cert.read_bytes(), (ca / "ca.key").read_bytes(), year_ago, yesterday))


def test_a_reload_keeps_the_certificate_in_force_when_the_new_one_has_expired_and_the_check_refuses_it(
    tmp_path: Path,
) -> None:
    """An expired certificate put in place of the served one (a backup restored): ``broker --check`` (what
    ``systemctl reload`` runs first) exits 2 naming the key, and a SIGHUP keeps serving the one in force,
    saying why; served, it would have turned every device away."""
    pki(tmp_path, "ca", "server-ca")
    server = ("issue", "server", "broker", "--ca", "server-ca", "--dns", "localhost", "--ip", "127.0.0.1")
    pki(tmp_path, *server, "--out", "tls/server")
    port = free_port()
    tls = {"certfile": "tls/server.pem", "keyfile": "tls/server.key"}
    config = {
        "listeners": [{"name": "devices", "type": "tls", "host": "127.0.0.1", "port": port, "tls": tls}],
        "storage": {"directory": "data"},
        "offsets_api": {"port": 0},
        "admin_http": {"port": 0},
    }
    broker, log = start_broker(tmp_path, config)
    try:
        wait_for_port(port, alive=broker.poll)
        device = ssl.create_default_context(cafile=str(tmp_path / "server-ca" / "ca.pem"))
        first = served_serial(port, device)
        expired_copy(tmp_path / "tls" / "server.pem", tmp_path / "server-ca", tmp_path / "tls" / "server.pem")
        check = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", "broker.yaml"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 2
        assert "listeners[0].tls.certfile: tls/server.pem expired at " in check.stderr
        broker.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "listener devices: certificate not reloaded" in log.read_text())
        assert "certfile: tls/server.pem expired at " in log.read_text()
        assert served_serial(port, device) == first
    finally:
        broker.terminate()
        assert broker.wait(timeout=20) == 0
