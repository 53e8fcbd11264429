"""``timestone pki revoke`` and a listener's ``tls.crlfile``: a device certificate revoked by the command
that issued it is refused at the TLS handshake, once the broker has read the CRL (at start, or SIGHUP),
while the CA's other certificates go on working."""

from __future__ import annotations

import logging
import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from broker_edge.config import ConfigError
from broker_edge.runtime.main import reload_files
from pipelines.cli import main
from tests.e2e.broker_clients import TIMEOUT, PahoClient

Certificates = dict[str, Path]


def pki(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``timestone pki ARGV``: its status and what it printed (standard output, then error)."""
    status = main(["pki", *argv])
    out, err = capsys.readouterr()
    return status, out + err


@pytest.fixture
def certificates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Certificates:
    ca = tmp_path / "ca"
    assert pki(capsys, "ca", str(ca))[0] == 0
    assert (
        pki(capsys, "issue", "server", "broker", "--ca", str(ca), "--dns", "localhost", "--ip", "127.0.0.1")[
            0
        ]
        == 0
    )
    for device in ("meter-1", "meter-2"):
        assert pki(capsys, "issue", "client", device, "--ca", str(ca))[0] == 0
    status, said = pki(capsys, "crl", "--ca", str(ca))
    assert status == 0 and said == f"wrote {ca / 'crl.pem'} (0 certificates revoked)\n"
    return {"ca": ca, "crl": ca / "crl.pem"}


def device(certificates: Certificates, name: str) -> ssl.SSLContext:
    ca = certificates["ca"]
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca / "ca.pem"))
    context.load_cert_chain(str(ca / f"client-{name}.pem"), str(ca / f"client-{name}.key"))
    return context


def handshake_refused(port: int, context: ssl.SSLContext) -> bool:
    """Whether the broker refuses this TLS client: during the handshake or (TLS 1.3) right after it. The
    client refusing the broker's certificate (one that does not name ``localhost``) says nothing of it: it
    raises."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00")  # a v5 CONNECT
                return tls.recv(100) == b""
        except ssl.SSLCertVerificationError:
            raise
        except (ssl.SSLError, ConnectionError):
            return True


def listener(certificates: Certificates) -> dict:
    ca = certificates["ca"]
    tls = {
        "certfile": str(ca / "server-broker.pem"),
        "keyfile": str(ca / "server-broker.key"),
        "cafile": str(ca / "ca.pem"),
        "require_client_cert": True,
        "crlfile": str(certificates["crl"]),
    }
    return {"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls}


def test_a_revoked_device_is_refused_once_the_broker_reads_the_crl_and_the_others_go_on(
    start_broker, certificates: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = start_broker(listeners=[listener(certificates)])
    assert PahoClient(broker.port, "m1", tls_context=device(certificates, "meter-1")).connack_result[1] == 0

    ca = certificates["ca"]
    status, said = pki(capsys, "revoke", str(ca / "client-meter-1.pem"), "--ca", str(ca))
    assert status == 0 and "(CN=meter-1," in said and f"revoked; wrote {certificates['crl']}" in said
    crl = x509.load_pem_x509_crl(certificates["crl"].read_bytes())
    revoked = x509.load_pem_x509_certificate((ca / "client-meter-1.pem").read_bytes())
    assert crl.get_revoked_certificate_by_serial_number(revoked.serial_number) is not None
    assert not handshake_refused(broker.port, device(certificates, "meter-1")), "until the broker reads it"

    broker.call(lambda: reload_files(broker.broker))  # what SIGHUP does
    assert handshake_refused(broker.port, device(certificates, "meter-1"))
    assert PahoClient(broker.port, "m2", tls_context=device(certificates, "meter-2")).connack_result[1] == 0

    status, said = pki(capsys, "revoke", str(ca / "client-meter-1.pem"), "--ca", str(ca))
    assert status == 0 and "was revoked already" in said
    assert len(x509.load_pem_x509_crl(certificates["crl"].read_bytes())) == 1


def test_revoke_refuses_the_ca_itself_and_a_certificate_another_ca_issued(
    tmp_path: Path, certificates: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = certificates["ca"]
    status, said = pki(capsys, "revoke", str(ca / "ca.pem"), "--ca", str(ca))
    assert status == 1 and "is the CA itself: a CA is replaced, not revoked" in said
    other = tmp_path / "other"
    assert pki(capsys, "ca", str(other))[0] == 0
    assert pki(capsys, "issue", "client", "stranger", "--ca", str(other))[0] == 0
    status, said = pki(capsys, "revoke", str(other / "client-stranger.pem"), "--ca", str(ca))
    assert status == 1 and f"was not issued by the CA in {ca}" in said
    assert len(x509.load_pem_x509_crl(certificates["crl"].read_bytes())) == 0


def test_a_crlfile_that_holds_no_crl_or_without_a_cafile_is_a_configuration_error_naming_it(
    start_broker, certificates: Certificates
) -> None:
    section = listener(certificates)
    section["tls"]["crlfile"] = str(certificates["ca"] / "ca.pem")  # a certificate, not a CRL
    with pytest.raises(ConfigError, match=r"crlfile.*holds no CRL"):
        start_broker(listeners=[section])
    section = listener(certificates)
    del section["tls"]["cafile"], section["tls"]["require_client_cert"]
    with pytest.raises(ConfigError, match=r"cafile.*required with crlfile"):
        start_broker(listeners=[section])


def test_a_device_connected_when_its_certificate_is_revoked_is_closed_by_the_reload_and_its_will_dropped(
    start_broker, certificates: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stolen key still connected when the operator revokes its certificate: the SIGHUP that reads the CRL
    closes that connection (v5 DISCONNECT 0x87, Not authorized) without publishing its will; the CA's
    other devices stay connected."""
    broker = start_broker(listeners=[listener(certificates)])
    thief = PahoClient(
        broker.port, "m1", tls_context=device(certificates, "meter-1"), will=("wills/m1", b"gone", 1, False)
    )
    thief.subscribe("plant/#", qos=1)
    owner = PahoClient(broker.port, "m2", tls_context=device(certificates, "meter-2"))
    owner.subscribe("wills/#", qos=1)
    ca = certificates["ca"]
    assert pki(capsys, "revoke", str(ca / "client-meter-1.pem"), "--ca", str(ca))[0] == 0
    owner.publish("plant/1/temp", b"before the reload", qos=1)
    assert thief.expect()[0].payload == b"before the reload"  # the broker has not read the CRL yet

    broker.call(lambda: reload_files(broker.broker))  # what SIGHUP does
    assert thief.disconnects.get(timeout=TIMEOUT) == 0x87
    owner.publish("plant/1/temp", b"after the reload", qos=1)
    owner.expect_none(0.3)  # no will of the revoked connection
    assert thief.messages.empty()
    assert handshake_refused(broker.port, device(certificates, "meter-1"))
    owner.disconnect()


def test_a_key_readable_by_every_user_is_said_at_start_and_at_each_reload(
    start_broker, certificates: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener's key left 0644 (copied with ``cp``, unpacked from an archive) works, and is a WARNING
    naming the key and its mode, as for a password file: any local user could take the server's key."""
    key = certificates["ca"] / "server-broker.key"
    key.chmod(0o644)
    caplog.set_level(logging.WARNING)
    broker = start_broker(listeners=[listener(certificates)])
    said = f"listener devices: tls.keyfile {key} is readable by every user (mode 644)"
    assert [r.getMessage() for r in caplog.records].count(
        said + ": use 0600, or 0640 with the group of the broker's user"
    ) == 1
    caplog.clear()
    broker.call(lambda: reload_files(broker.broker))
    assert any(r.getMessage().startswith(said) for r in caplog.records)
    key.chmod(0o640)
    caplog.clear()
    broker.call(lambda: reload_files(broker.broker))
    assert not any("readable by every user" in r.getMessage() for r in caplog.records)


def test_a_ca_added_to_the_cafile_without_its_crl_is_refused_naming_it_and_a_reload_keeps_the_files_in_force(
    start_broker, tmp_path: Path, certificates: Certificates, capsys: pytest.CaptureFixture[str], caplog
) -> None:
    """A devices' CA rotation on a listener checking CRLs: the new CA put beside the old one in ``cafile``
    but its CRL not in ``crlfile`` would have every device of the new CA refused ('unable to get certificate
    CRL', the device told 'unknown CA'). The start and ``broker --check`` refuse it naming ``crlfile`` and
    the CA; a SIGHUP keeps the files in force, and the old CA's devices go on connecting."""
    ca = certificates["ca"]
    new_ca = tmp_path / "ca-2"
    assert pki(capsys, "ca", str(new_ca), "--name", "devices 2")[0] == 0
    trusted = tmp_path / "cas.pem"
    trusted.write_bytes((ca / "ca.pem").read_bytes())
    section = listener(certificates)
    section["tls"]["cafile"] = str(trusted)
    broker = start_broker(listeners=[section])

    trusted.write_bytes((ca / "ca.pem").read_bytes() + (new_ca / "ca.pem").read_bytes())
    caplog.set_level(logging.INFO)
    broker.call(lambda: reload_files(broker.broker))
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(said) == 1 and "listener devices: certificate not reloaded" in said[0], said
    assert f"crlfile: {certificates['crl']} holds no CRL of the CA CN=devices 2 CA,O=devices 2" in said[0]
    assert PahoClient(broker.port, "m2", tls_context=device(certificates, "meter-2")).connack_result[1] == 0

    with pytest.raises(ConfigError, match=r"crlfile: .* holds no CRL of the CA CN=devices 2 CA"):
        start_broker(listeners=[section])
    assert pki(capsys, "crl", "--ca", str(new_ca))[0] == 0
    certificates["crl"].write_bytes(certificates["crl"].read_bytes() + (new_ca / "crl.pem").read_bytes())
    caplog.clear()
    broker.call(lambda: reload_files(broker.broker))
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]


def test_the_metrics_say_when_each_served_certificate_expires_and_follow_a_renewal(
    start_broker, certificates: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing said a served certificate was about to expire until devices were refused: each TLS endpoint's
    certificate end is a gauge (Unix time), to alert on before it comes, and a renewal read by SIGHUP
    moves it."""
    broker = start_broker(listeners=[listener(certificates)])
    served = certificates["ca"] / "server-broker.pem"
    metric = "timestone_broker_tls_certificate_expiry_timestamp_seconds"

    def not_after() -> float:
        return x509.load_pem_x509_certificate(served.read_bytes()).not_valid_after_utc.timestamp()

    first = not_after()
    assert broker.metric(metric, endpoint="listener devices") == first
    ca = certificates["ca"]
    assert pki(capsys, "renew", str(served), "--ca", str(ca), "--days", "400")[0] == 0
    assert broker.metric(metric, endpoint="listener devices") == first  # served until the broker reads it
    broker.call(lambda: reload_files(broker.broker))
    assert broker.metric(metric, endpoint="listener devices") == not_after() > first
