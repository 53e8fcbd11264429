"""X.509 certificates and keys made with ``cryptography``, and written as PEM files an operator can trust.

``build_ca`` makes a self-signed CA that signs certificates only (path length 0); ``build_leaf`` a certificate
it signs, for serving and/or connecting, with subject alternative names. Keys are EC P-256 by default
(milliseconds to make, what every TLS stack of this decade speaks), RSA 3072 for device stacks without ECDSA.
``write_key`` and ``write_certificate`` replace a file whole (a reader never sees half of one: a broker
reloading on SIGHUP gets the old file or the new one), a new key readable by its owner only (0600);
``write_pair`` replaces a certificate and its key together or neither. A file replaced keeps its owner, group
and mode (``broker_edge.security.replace_files``).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker_edge.security.replace_files import replace_files

__all__ = [
    "KeyType",
    "LeafKey",
    "PrivateKey",
    "build_ca",
    "build_leaf",
    "key_like",
    "new_key",
    "subject_name",
    "write_certificate",
    "write_key",
    "write_pair",
]

KeyType = Literal["ec", "rsa"]
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

BACKDATE = datetime.timedelta(minutes=5)
"""A certificate is valid from a little before it was made: clocks of the machines that check it differ."""


LeafKey = PrivateKey | ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey
"""The key of a certificate a CA signs: one that ``new_key`` makes, or one of another tool's kinds a renewal
keeps (a CA's own key is EC or RSA)."""

MIN_RSA_BITS = 2048
"""The least RSA size a renewal keeps (OpenSSL's default security level refuses smaller keys)."""


def new_key(kind: KeyType = "ec") -> PrivateKey:
    """A new private key: EC P-256, or RSA 3072."""
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=3072)
    return ec.generate_private_key(ec.SECP256R1())


def key_like(public_key: CertificatePublicKeyTypes) -> LeafKey:
    """A new private key of the kind of ``public_key``: the same EC curve, the same RSA size (at least
    ``MIN_RSA_BITS``), Ed25519 or Ed448; EC P-256 for any other kind (DSA, which TLS 1.3 does not speak)."""
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        return ec.generate_private_key(public_key.curve)
    if isinstance(public_key, rsa.RSAPublicKey):
        size = max(public_key.key_size, MIN_RSA_BITS)
        return rsa.generate_private_key(public_exponent=65537, key_size=size)
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return ed25519.Ed25519PrivateKey.generate()
    if isinstance(public_key, ed448.Ed448PublicKey):
        return ed448.Ed448PrivateKey.generate()
    return new_key()


def subject_name(common_name: str | None, organization: str) -> x509.Name:
    """``O=<organization>`` and, unless None, ``CN=<common_name>``."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)]
    if common_name is not None:
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - BACKDATE).not_valid_after(now + datetime.timedelta(days=days))


def build_ca(
    subject: x509.Name, days: int = 3650, key: PrivateKey | None = None
) -> tuple[PrivateKey, x509.Certificate]:
    """A self-signed CA certificate that signs end certificates only, and its key."""
    key = key or new_key()
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return key, _validity(builder, days).sign(key, hashes.SHA256())


def build_leaf(
    ca_key: PrivateKey,
    ca_cert: x509.Certificate,
    subject: x509.Name,
    *,
    server: bool,
    client: bool,
    names: tuple[x509.GeneralName, ...] = (),
    days: int = 365,
    key: LeafKey | None = None,
    usages: Sequence[x509.ObjectIdentifier] | None = None,
) -> tuple[LeafKey, x509.Certificate]:
    """A certificate signed by the CA, for serving (``server``) and/or connecting (``client``), with
    ``names`` as its subject alternative names; a new key unless ``key`` is given. ``usages``: its extended
    key usages as they are, instead of ``server`` and ``client`` (none: no such extension, any use)."""
    key = key or new_key()
    if usages is None:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if usages:  # (an empty one is no valid DER, and no peer would take the certificate for any use)
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return key, _validity(builder, days).sign(ca_key, hashes.SHA256())


def _key_bytes(key: LeafKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _certificate_bytes(*certificates: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def write_key(path: Path, key: LeafKey) -> None:
    """``key`` as unencrypted PKCS#8 PEM; a new file readable by its owner only (0600)."""
    replace_files([(Path(path), _key_bytes(key), 0o600)])


def write_certificate(path: Path, *certificates: x509.Certificate) -> None:
    """``certificates`` as PEM, one after the other (a new file 0644: a certificate is public)."""
    replace_files([(Path(path), _certificate_bytes(*certificates), 0o644)])


def write_pair(
    cert: Path,
    key_path: Path,
    key: LeafKey,
    certificate: x509.Certificate,
    *chain: x509.Certificate,
    new: bool = False,
) -> None:
    """A certificate (followed by ``chain``, the intermediates that signed it) and its key, both replaced or,
    on any failure before the renames, neither; ``new``: both made, never replacing files that exist
    (``FileExistsError``, neither made)."""
    files = [
        (Path(key_path), _key_bytes(key), 0o600),
        (Path(cert), _certificate_bytes(certificate, *chain), 0o644),
    ]
    replace_files(files, new=new)
