"""``tls.crl_check: chain``: every certificate of a device's chain checked against the CRLs, the
intermediate CAs' included (another PKI's root -> intermediate -> devices). The CRLs are written by
``timestone pki`` from the root's and the intermediate's directories; ``crlfile`` must hold the CRL of each
CA of ``cafile`` (the root's too), and a device whose chain brings an intermediate without a CRL there is
refused at the handshake. In ``leaf`` mode (the default) only the device's own certificate is checked."""

from __future__ import annotations

import http.client
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.runtime.main import reload_files
from broker_edge.security.tls import TlsConfig, files_not_valid_now
from tests.e2e.broker_clients import TIMEOUT, PahoClient, wait_for
from tests.e2e.security.test_certificate_revocation import handshake_refused, pki
from tests.e2e.security.test_https_certificate_lifetime import ask, kept_alive, refusals
from tests.e2e.security.test_intermediate_cas import DAY, NOW, OtherPki, devices_listener, pem
from tests.e2e.security.test_tls_session_resumption import accepted, connack
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, pki_in, site_section


def _key(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def pki_directories(other: OtherPki, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    """``other``'s root and intermediate as ``timestone pki`` directories (``ca.pem``, ``ca.key``), each
    with its CRL written by ``timestone pki crl``."""
    root, intermediate = other.directory / "root-ca", other.directory / "intermediate-ca"
    for directory, chain, key in (
        (root, (other.root,), other.root_key),
        (intermediate, (other.intermediate, other.root), other.key),
    ):
        directory.mkdir()
        (directory / "ca.pem").write_bytes(pem(*chain))
        (directory / "ca.key").write_bytes(_key(key))
        assert pki(capsys, "crl", "--ca", str(directory))[0] == 0
    return root, intermediate


def crlfile(path: Path, *directories: Path) -> Path:
    """``path`` written with the CRLs of the CAs of ``directories``, as an operator cats them."""
    path.write_bytes(b"".join((directory / "crl.pem").read_bytes() for directory in directories))
    return path


def chain_listener(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], crls: Path, crl_check: str = "chain"
) -> dict[str, Any]:
    """A ``devices`` listener trusting the root alone, checking ``crls`` in ``crl_check`` mode."""
    section = devices_listener(tmp_path, capsys, tmp_path / "root.pem", crls)
    section["tls"]["crl_check"] = crl_check
    return section


def revoke_intermediate(other: OtherPki, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The root revokes the intermediate (``timestone pki revoke`` in the root's directory)."""
    (other.directory / "intermediate.pem").write_bytes(pem(other.intermediate))
    assert pki(capsys, "revoke", str(other.directory / "intermediate.pem"), "--ca", str(root))[0] == 0


def test_chain_mode_accepts_a_device_under_a_good_intermediate_and_closes_it_once_the_root_revokes_it(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A device under a good intermediate connects; the root revokes the intermediate, and the SIGHUP that
    reads its new CRL closes the device's open connection (v5 DISCONNECT 0x87, one WARNING naming the CA's
    serial) and refuses its next handshake."""
    other = OtherPki(tmp_path)
    root, intermediate = pki_directories(other, capsys)
    crls = crlfile(tmp_path / "crls.pem", root, intermediate)
    broker = start_broker(listeners=[chain_listener(tmp_path, capsys, crls)])
    meter = other.device("meter-1")
    device = PahoClient(broker.port, "m1", tls_context=meter)
    assert device.connack_result[1] == 0

    revoke_intermediate(other, root, capsys)
    crlfile(crls, root, intermediate)
    caplog.set_level(logging.WARNING)
    broker.call(lambda: reload_files(broker.broker))
    assert device.disconnects.get(timeout=TIMEOUT) == 0x87
    said = [r.getMessage() for r in caplog.records if "closing the connection" in r.getMessage()]
    serial = other.intermediate.serial_number
    assert said == [
        f"closing the connection: the certificate of a CA of its chain (serial {serial:x}) is revoked in "
        f"{crls} (CN=meter-1)"
    ]
    assert handshake_refused(broker.port, meter)


def test_chain_mode_refuses_at_the_start_a_crlfile_without_the_roots_crl(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every CA of the chain is checked, the root too: without its CRL every device would be refused
    ('unable to get certificate CRL'), so the start refuses the file, naming the field and the CA."""
    other = OtherPki(tmp_path)
    _, intermediate = pki_directories(other, capsys)
    crls = crlfile(tmp_path / "crls.pem", intermediate)
    with pytest.raises(ConfigError, match=r"crlfile: .*crls.pem holds no CRL of the CA CN=plant root in "):
        start_broker(listeners=[chain_listener(tmp_path, capsys, crls)])


def test_leaf_mode_does_not_check_the_intermediate(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default checks a device's own certificate only: its intermediate revoked by the root changes
    nothing, at a SIGHUP or at the next handshake."""
    other = OtherPki(tmp_path)
    root, intermediate = pki_directories(other, capsys)
    revoke_intermediate(other, root, capsys)
    crls = crlfile(tmp_path / "crls.pem", root, intermediate)
    broker = start_broker(listeners=[chain_listener(tmp_path, capsys, crls, crl_check="leaf")])
    meter = other.device("meter-1")
    device = PahoClient(broker.port, "m1", tls_context=meter)
    assert device.connack_result[1] == 0
    broker.call(lambda: reload_files(broker.broker))
    device.publish("plant/1/temp", b"21.5", qos=1)
    assert device.disconnects.empty()
    assert not handshake_refused(broker.port, meter)
    device.disconnect()


def test_crl_check_is_leaf_or_chain_and_chain_needs_a_crlfile() -> None:
    files = {"certfile": "c", "keyfile": "k", "cafile": "ca.pem"}
    assert load_dataclass(TlsConfig, files, "tls").crl_check == "leaf"
    with pytest.raises(ConfigError, match=r"^tls\.crl_check: expected one of 'leaf', 'chain'"):
        load_dataclass(TlsConfig, {**files, "crl_check": "all"}, "tls")
    with pytest.raises(ConfigError, match=r"^tls\.crlfile: required with crl_check: chain"):
        load_dataclass(TlsConfig, {**files, "crl_check": "chain"}, "tls")


def test_chain_mode_says_the_roots_crl_expired_which_leaf_mode_does_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In chain mode an expired CRL of the root refuses every device: said as a file no longer valid (a
    start says it at ERROR, a reload and ``broker --check`` refuse it); leaf mode does not read it."""
    other = OtherPki(tmp_path)
    _, intermediate = pki_directories(other, capsys)
    builder = x509.CertificateRevocationListBuilder().issuer_name(other.root.subject)
    expired = builder.last_update(NOW - 2 * DAY).next_update(NOW - DAY).sign(other.root_key, hashes.SHA256())
    crls = crlfile(tmp_path / "crls.pem", intermediate)
    crls.write_bytes(crls.read_bytes() + expired.public_bytes(serialization.Encoding.PEM))
    tls = chain_listener(tmp_path, capsys, crls)["tls"]
    assert files_not_valid_now(TlsConfig(**tls)) == (
        "crlfile",
        f"the CRL of the CA CN=plant root in {crls} has expired: every certificate it issued is refused; "
        "write it again (timestone pki crl --ca DIR)",
    )
    assert files_not_valid_now(TlsConfig(**{**tls, "crl_check": "leaf"})) is None


def test_chain_mode_refuses_a_device_whose_intermediate_has_no_crl_naming_why(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """An intermediate the device sends is not known before it comes: without its CRL in ``crlfile``, the
    handshake is refused (OpenSSL: unable to get certificate CRL), counted and logged by that reason."""
    other = OtherPki(tmp_path)
    root, _ = pki_directories(other, capsys)
    broker = start_broker(listeners=[chain_listener(tmp_path, capsys, crlfile(tmp_path / "crls.pem", root))])
    caplog.set_level(logging.INFO)
    assert handshake_refused(broker.port, other.device("meter-1"))
    reason = "unable_to_get_certificate_crl"
    failures = "timestone_broker_tls_handshake_failures_total"
    assert wait_for(lambda: broker.metric(failures, listener="devices", reason=reason) == 1)
    lines = [r for r in caplog.records if getattr(r, "tls_reason", None) == reason]
    assert len(lines) == 1 and lines[0].getMessage() == f"TLS handshake failed: {reason}"
    assert "tls.crlfile" in getattr(lines[0], "hint", "")


def test_chain_mode_refuses_the_next_request_of_a_kept_alive_https_connection_under_a_revoked_intermediate(
    brokers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The offsets API checks the chain as a listener does: after the SIGHUP that reads the root's CRL
    revoking the intermediate, a reader's kept-alive connection through it is answered 403 and closed."""
    other = OtherPki(tmp_path)
    root, intermediate = pki_directories(other, capsys)
    crls = crlfile(tmp_path / "crls.pem", root, intermediate)
    tls = chain_listener(tmp_path, capsys, crls)["tls"]
    broker = brokers(offsets_api={"host": "127.0.0.1", "port": 0, "tls": tls})
    connection = kept_alive(broker.broker.offsets_port, other.device("reader-1"))

    revoke_intermediate(other, root, capsys)
    crlfile(crls, root, intermediate)
    broker.call(lambda: reload_files(broker.broker))
    status, body, closing = ask(connection)
    assert (status, body.get("error"), closing) == (403, "certificate_revoked", "close"), body
    assert "the certificate of a CA of its chain" in body["message"]
    assert refusals(broker, "certificate_revoked") == 1


def resumed_after_reload(
    start_broker: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], crl_check: str, revoked: bool
) -> tuple[Any, bool, bool]:
    """A device of the intermediate (sending it) connects, a SIGHUP reads the CRLs (the intermediate
    ``revoked`` by the root, or nothing changed), and it connects again resuming its TLS session: the
    broker, whether the session was resumed, and whether it was accepted."""
    other = OtherPki(tmp_path)
    root, intermediate = pki_directories(other, capsys)
    crls = crlfile(tmp_path / "crls.pem", root, intermediate)
    broker = start_broker(listeners=[chain_listener(tmp_path, capsys, crls, crl_check)])
    context = other.device("meter-1")
    answer, session, _ = connack(broker.port, context, "tls")
    assert accepted(answer, "tls"), answer
    if revoked:
        revoke_intermediate(other, root, capsys)
        crlfile(crls, root, intermediate)
    broker.call(lambda: reload_files(broker.broker))
    answer, _, resumed = connack(broker.port, context, "tls", session)
    return broker, resumed, accepted(answer, "tls")


@pytest.mark.parametrize("crl_check", ["leaf", "chain"])
def test_a_session_resumed_after_a_reload_that_changed_nothing_is_accepted(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str], crl_check: str
) -> None:
    """A resumed session holds the device's certificate alone: its chain is found again by the names of the
    CAs a full handshake showed. It was refused as untrusted after any SIGHUP, the intermediate's name
    taken for a CA ``cafile`` (the root alone) had to hold."""
    broker, resumed, accepted_again = resumed_after_reload(start_broker, tmp_path, capsys, crl_check, False)
    assert resumed and accepted_again
    assert broker.metric("timestone_broker_connections_refused_total", reason="certificate_untrusted") == 0


def test_chain_mode_refuses_a_session_resumed_under_an_intermediate_a_reload_revoked(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenSSL verifies no resumed TLS session: one begun before the SIGHUP that brought the root's CRL
    revoking the intermediate is refused all the same, before its CONNECT is read."""
    broker, resumed, accepted_again = resumed_after_reload(start_broker, tmp_path, capsys, "chain", True)
    assert resumed and not accepted_again
    assert broker.metric("timestone_broker_connections_refused_total", reason="certificate_revoked") == 1


def test_chain_mode_ends_the_uplink_of_a_site_under_an_intermediate_a_sighup_revoked(
    brokers, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The uplink hub checks the chain as a listener does: a site whose certificate the intermediate issued
    (``timestone pki issue site`` in the intermediate's directory) is linked, and the SIGHUP that reads the
    root's CRL revoking the intermediate ends its link, saying so once."""
    other = OtherPki(tmp_path)
    root, intermediate = pki_directories(other, capsys)
    assert pki(capsys, "issue", "site", "plant-r", "--ca", str(intermediate), "--days", "7")[0] == 0
    crls = crlfile(tmp_path / "crls.pem", root, intermediate)
    hub_pki = pki_in(tmp_path)
    section = hub_section(hub_pki)
    section["tls"].update(cafile=str(tmp_path / "root.pem"), crlfile=str(crls), crl_check="chain")
    hub = brokers("hub", uplink_hub=section)
    site = site_section(hub_pki, "plant-r", hub_port(hub))
    site["tls"].update(
        certfile=str(intermediate / "site-plant-r.pem"), keyfile=str(intermediate / "site-plant-r.key")
    )
    brokers("site", uplink=site)
    assert wait_for(lambda: hub.metric("timestone_broker_uplink_site_connected", site="plant-r") == 1)

    caplog.set_level(logging.WARNING)
    revoke_intermediate(other, root, capsys)
    crlfile(crls, root, intermediate)
    hub.call(lambda: reload_files(hub.broker))
    closes = "timestone_broker_uplink_site_certificate_closes"
    assert wait_for(lambda: hub.metric(closes, site="plant-r", reason="revoked") == 1)
    said = [r.getMessage() for r in caplog.records if "closing its uplink" in r.getMessage()]
    assert len(said) == 1 and "the certificate of a CA of its chain" in said[0], said


def test_the_offsets_api_in_chain_mode_says_why_a_client_whose_intermediate_has_no_crl_is_refused(
    brokers, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """An HTTPS endpoint's refusal line says what a listener's says: which CRL to add."""
    other = OtherPki(tmp_path)
    root, _ = pki_directories(other, capsys)
    tls = chain_listener(tmp_path, capsys, crlfile(tmp_path / "crls.pem", root))["tls"]
    broker = brokers(offsets_api={"host": "127.0.0.1", "port": 0, "tls": tls})
    caplog.set_level(logging.INFO)
    connection = http.client.HTTPSConnection(
        "127.0.0.1", broker.broker.offsets_port, timeout=10, context=other.device("reader-1")
    )
    with pytest.raises((ssl.SSLError, ConnectionError)):
        ask(connection)
    connection.close()
    reason = "unable_to_get_certificate_crl"
    assert wait_for(lambda: any(getattr(r, "tls_reason", None) == reason for r in caplog.records))
    lines = [r for r in caplog.records if getattr(r, "tls_reason", None) == reason]
    assert "tls.crlfile" in getattr(lines[0], "hint", ""), lines[0].__dict__
