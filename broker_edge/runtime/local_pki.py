"""A throwaway PKI for a cluster on loopback (the demo, benchmarks and tests), never for production.

``LocalPki(directory)`` makes a CA once (kept in ``directory``, reused by later calls) and issues from it:

- ``member(node_id)``: a member's certificate, naming the node as ``timestone://node/<node_id>`` (what
  ``member_identity`` checks), good for serving and connecting;
- ``server(name)``: a server certificate for ``127.0.0.1``, ``::1`` and ``localhost`` (an etcd);
- ``client(name)``: a client certificate whose subject CN is ``name`` (an etcd client).

Keys are EC P-256 (milliseconds to make), written unencrypted at mode 0600. Production clusters use the
operator's PKI: docs/security.md shows the ``openssl`` commands that make the same certificates.
``build_ca`` and ``build_leaf`` are the builders, shared with the tests' own PKI.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker_edge.cluster.links.member_identity import member_uri
from broker_edge.uplink.site_identity import site_uri

__all__ = ["LOOPBACK_NAMES", "LocalPki", "PemPair", "build_ca", "build_leaf", "write_key"]

LOOPBACK_NAMES: tuple[x509.GeneralName, ...] = (
    x509.DNSName("localhost"),
    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    x509.IPAddress(ipaddress.ip_address("::1")),
)


@dataclass(frozen=True)
class PemPair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


def _name(common_name: str | None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Timestone local")]
    if common_name is not None:
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def build_ca(common_name: str, days: int = 30) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA certificate and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def build_leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str | None,
    *,
    server: bool,
    client: bool,
    names: tuple[x509.GeneralName, ...] = (),
    days: int = 30,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate signed by the CA, for serving and/or connecting, with ``names`` as its subject
    alternative names (and no subject CN when ``common_name`` is None)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write ``key`` as unencrypted PKCS#8 PEM, readable by its owner only."""
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


class LocalPki:
    """A CA in ``directory`` (made on first use) and the certificates it issues (see the module
    docstring); ``name`` tells apart several CAs in one directory."""

    def __init__(self, directory: str | Path, name: str = "ca") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca = PemPair(self.directory / f"{name}.pem", self.directory / f"{name}.key")
        if not self.ca.cert.exists():
            key, certificate = build_ca(f"Timestone local {name}")
            write_key(self.ca.key, key)
            _write_cert(self.ca.cert, certificate)
        self._ca_key = serialization.load_pem_private_key(self.ca.key.read_bytes(), None)
        self._ca_cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())

    def _issue(
        self,
        stem: str,
        common_name: str | None,
        *,
        server: bool,
        client: bool,
        names: tuple[x509.GeneralName, ...] = (),
    ) -> PemPair:
        pair = PemPair(self.directory / f"{stem}.pem", self.directory / f"{stem}.key")
        if not pair.cert.exists():
            assert isinstance(self._ca_key, ec.EllipticCurvePrivateKey)
            key, certificate = build_leaf(
                self._ca_key, self._ca_cert, common_name, server=server, client=client, names=names
            )
            write_key(pair.key, key)
            _write_cert(pair.cert, certificate)
        return pair

    def member(self, node_id: str) -> PemPair:
        """A member's certificate for ``node_id`` (made once, then reused)."""
        names = (x509.UniformResourceIdentifier(member_uri(node_id)), *LOOPBACK_NAMES)
        return self._issue(f"member-{node_id}", node_id, server=True, client=True, names=names)

    def site(self, site_id: str) -> PemPair:
        """A site's uplink certificate for ``site_id`` (made once, then reused)."""
        names = (x509.UniformResourceIdentifier(site_uri(site_id)),)
        return self._issue(f"site-{site_id}", site_id, server=False, client=True, names=names)

    def server(self, name: str) -> PemPair:
        """A server certificate for loopback (good for connecting too: etcd's JSON gateway connects to
        its own gRPC server with it)."""
        return self._issue(f"server-{name}", name, server=True, client=True, names=LOOPBACK_NAMES)

    def client(self, name: str, common_name: bool = True) -> PemPair:
        """A client certificate whose subject CN is ``name`` (none without ``common_name``: etcd's JSON
        gateway refuses a client certificate with a CN when it checks client certificates)."""
        return self._issue(f"client-{name}", name if common_name else None, server=False, client=True)
