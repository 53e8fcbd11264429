"""A member that cannot reach etcd for its TLS files says which file and what to do, and joins again once
the file is mended and the broker is sent SIGHUP. gRPC words a client certificate etcd refused (it expired)
as "Unwrap failed (TSI_DATA_CORRUPTED)", naming no certificate, and an etcd certificate of a CA the broker
does not hold as "CERTIFICATE_VERIFY_FAILED", naming no setting."""

from __future__ import annotations

import asyncio
import datetime
import signal
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker_edge.cluster.coordination.etcd import Etcd, EtcdError
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.cluster import EtcdTlsConfig
from tests.harness.local_cluster import EtcdTarget, cluster_broker, wait_until

pytestmark = pytest.mark.timeout(120)


def short_lived_client(pki: LocalPki, out: Path, seconds: float) -> None:
    """A client certificate of ``pki``'s CA valid until ``seconds`` from now (past when negative), as
    ``out``.pem and .key."""
    ca_directory = Path(pki.authority.directory)
    ca_key = serialization.load_pem_private_key((ca_directory / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate(Path(pki.ca.cert).read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "timestone")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(seconds=seconds))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out.with_suffix(".pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    out.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def test_an_expired_etcd_client_certificate_is_said_naming_its_file_and_sighup_after_renewing_is_enough(
    private_etcd: EtcdTarget, tmp_path: Path
) -> None:
    """A certificate is checked at the handshake only: one that expires under an open channel is refused
    when the channel connects again (etcd restarted, a connection lost), as one expired at the start is."""
    server = private_etcd.server
    assert server.pki is not None
    certificate = tmp_path / "etcd-client"
    short_lived_client(server.pki, certificate, -1)
    etcd_tls = {
        "cafile": str(server.pki.ca.cert),
        "certfile": str(certificate.with_suffix(".pem")),
        "keyfile": str(certificate.with_suffix(".key")),
    }
    broker = cluster_broker(
        tmp_path, private_etcd, "a", {"etcd_tls": etcd_tls, "replication_factor": 1, "min_insync_replicas": 1}
    )
    broker.start()
    try:
        log = broker.log_path
        said = f"etcd_tls.certfile {etcd_tls['certfile']}, the client certificate, expired"
        wait_until(lambda: said in log.read_text(), 60, "the expiry said", lambda: log.read_text()[-3000:])
        assert "a unfenced" not in log.read_text()
        short_lived_client(server.pki, certificate, 3600)  # renewed in place
        assert broker.process is not None
        broker.process.send_signal(signal.SIGHUP)
        wait_until(
            lambda: "a unfenced" in log.read_text(), 60, "a in the cluster", lambda: log.read_text()[-3000:]
        )
    finally:
        broker.stop()


def test_an_etcd_certificate_of_a_ca_the_member_does_not_hold_is_said_naming_its_ca_file(
    private_etcd: EtcdTarget, tmp_path: Path
) -> None:
    """etcd's CA rotated while the member's ``etcd_tls.cafile`` holds the old one only."""
    tls = private_etcd.server.tls
    assert tls is not None
    old_ca = LocalPki(tmp_path / "old-pki").ca.cert
    member_tls = EtcdTlsConfig(str(old_ca), tls.certfile, tls.keyfile)

    async def read() -> str:
        etcd = Etcd([private_etcd.url], 2.0, member_tls, private_etcd.auth)
        try:
            await etcd.get(f"{private_etcd.prefix}/k")
        except EtcdError as error:
            return str(error)
        finally:
            await etcd.close()
        return "read"

    said = asyncio.run(read())
    assert f"etcd's certificate was not accepted against etcd_tls.cafile {old_ca}" in said, said
