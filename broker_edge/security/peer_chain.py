"""What a client's certificate chain rests on, read at the handshake: when it ends, and which CAs it needs.

OpenSSL checks a client certificate's dates and chain at the handshake only: a connection outlives both its
certificate's end and the trust in its CA. ``peer_chain`` reads the chain OpenSSL verified (the client's
certificate first, the trusted root last) and keeps two things of it, shared by the connections of one chain:

- ``end``: the earliest notAfter in it (the client's certificate's, or a CA's that ends first), when the
  connection's authorization ends (``engine.connection.certificate_ends`` closes it then);
- ``needs``: the CAs a CA file must hold for the chain to verify again (its root, and the intermediates the
  client did not send: it sends the same ones at its next handshake); ``trusted_keys`` reads a reloaded
  ``cafile`` into the keys ``needs`` is compared with;
- ``cas``: the CAs of the chain, each by its issuer and serial number, as its issuer's CRL lists it (a
  reloaded ``crlfile`` checked for the whole chain, ``tls.crl_check: chain``, may revoke one).

A CA is known by its subject and public key together: a new CA of the same name (a key replaced) is another.
A resumed TLS session has no verified chain: its client certificate is read alone, and its CAs are found by
name among those full handshakes showed (``_BY_NAME``): it needs trusted its root and the CAs no client sent
(one no handshake showed, by its name).
"""

from __future__ import annotations

import hashlib
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

if TYPE_CHECKING:
    from cryptography import x509

__all__ = [
    "CertificateId",
    "PeerChain",
    "certificate_id",
    "crls_in",
    "peer_chain",
    "revoked_in",
    "trusted_keys",
]

CertificateId = tuple[bytes, int]
"""A certificate's issuer (its DER encoding) and serial number: what a CRL lists it by."""

_Item = TypeVar("_Item", bytes, CertificateId)

_DER = 2
"""``_ssl.ENCODING_DER``: how the certificates of a chain are asked for."""

_MAX_KNOWN = 4096
"""CA certificates (and needs) remembered; past it the tables start again."""
_MAX_DEPTH = 16
"""CAs followed up a resumed session's chain, at most."""


@dataclass(frozen=True, slots=True)
class PeerChain:
    """When a client's verified chain ends, and what it needs trusted (see the module docstring)."""

    end: float
    """The earliest notAfter of the chain (Unix time)."""
    ending: str
    """Whose notAfter ``end`` is: "" for the client's certificate, else the CA's subject."""
    needs: frozenset[bytes]
    """The keys (``trusted_keys``) of the CAs a CA file must hold for the chain to verify."""
    cas: frozenset[CertificateId]
    """The CAs of the chain (its root's included), each by issuer and serial number."""


def _key(certificate: x509.Certificate) -> bytes:
    """A CA as a trust store holds it: its subject and public key, together."""
    from cryptography.hazmat.primitives import serialization

    spki = certificate.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(certificate.subject.public_bytes() + b"\0" + spki).digest()


def _name_key(name: bytes) -> bytes:
    """A CA known by its name (DER) alone (on a resumed session, one no full handshake showed)."""
    return hashlib.sha256(b"name\0" + name).digest()


class _Ca(NamedTuple):
    """A CA certificate as a chain uses it."""

    key: bytes
    not_after: float
    subject: str
    identity: CertificateId
    name: bytes
    """Its subject, DER."""
    issuer: bytes
    """Its issuer's name, DER (its own for a root)."""


_CAS: dict[bytes, _Ca] = {}
"""A CA certificate's DER → what a chain uses of it (CAs are few; each chain's are read once)."""
_BY_NAME: dict[bytes, tuple[bytes, bool]] = {}
"""A CA's subject (DER) → its DER as a verified chain last held it, and whether a client ever sent it: how
the chain of a resumed session, which holds the client's certificate alone, is found again."""
_SHARED: dict[frozenset[Any], frozenset[Any]] = {}
"""Each distinct ``needs`` and ``cas``, kept once: every connection of a chain holds the same objects."""


def _ca(der: bytes) -> _Ca:
    known = _CAS.get(der)
    if known is None:
        from cryptography import x509

        certificate = x509.load_der_x509_certificate(der)
        if len(_CAS) >= _MAX_KNOWN:
            _CAS.clear()
        issuer = certificate.issuer.public_bytes()
        known = _CAS[der] = _Ca(
            _key(certificate),
            certificate.not_valid_after_utc.timestamp(),
            certificate.subject.rfc4514_string(),
            (issuer, certificate.serial_number),
            certificate.subject.public_bytes(),
            issuer,
        )
    return known


def _seen(ca: _Ca, der: bytes, sent: bool) -> None:
    """``ca`` was in a verified chain (``sent`` by its client, or of the CA file)."""
    if len(_BY_NAME) >= _MAX_KNOWN and ca.name not in _BY_NAME:
        _BY_NAME.clear()
    was_sent = _BY_NAME.get(ca.name, (b"", False))[1]
    _BY_NAME[ca.name] = (der, sent or was_sent)


def _shared(items: frozenset[_Item]) -> frozenset[_Item]:
    if len(_SHARED) >= _MAX_KNOWN:
        _SHARED.clear()
    return cast("frozenset[_Item]", _SHARED.setdefault(items, items))


def _chains(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> tuple[list[bytes], list[bytes]]:
    """The verified chain and the certificates the client sent (its own first), as DER; the verified one is
    empty for a resumed session. Python 3.13 names them; 3.11 and 3.12 have them on the inner object."""
    inner: Any = getattr(ssl_object, "_sslobj", None)
    if hasattr(ssl_object, "get_verified_chain"):
        inner = ssl_object
    if inner is None:
        return [], []

    def der(chain: list[Any] | None) -> list[bytes]:
        return [c if isinstance(c, bytes) else c.public_bytes(_DER) for c in chain or ()]

    return der(inner.get_verified_chain()), der(inner.get_unverified_chain())


def peer_chain(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> PeerChain | None:
    """What the client's certificate chain rests on (None: it sent no certificate)."""
    if ssl_object is None:
        return None
    leaf_der = ssl_object.getpeercert(binary_form=True)
    if not leaf_der:
        return None
    from cryptography import x509

    leaf = x509.load_der_x509_certificate(leaf_der)
    end, ending = leaf.not_valid_after_utc.timestamp(), ""
    verified, sent = _chains(ssl_object)
    if len(verified) < 2:  # a resumed session
        return _resumed(leaf.issuer.public_bytes(), end, ending)
    sent_set = set(sent)
    needs: set[bytes] = set()
    ids: set[CertificateId] = set()
    for index, der in enumerate(verified[1:], start=1):
        ca = _ca(der)
        _seen(ca, der, der in sent_set)
        if ca.not_after < end:
            end, ending = ca.not_after, ca.subject
        if index == len(verified) - 1 or der not in sent_set:
            needs.add(ca.key)
        ids.add(ca.identity)
    return PeerChain(end, ending, _shared(frozenset(needs)), _shared(frozenset(ids)))


def _resumed(issuer: bytes, end: float, ending: str) -> PeerChain:
    """The chain of a resumed session whose client certificate (ending at ``end``) ``issuer`` signed, as
    full handshakes showed its CAs, each by name: it needs trusted its root and the CAs no client sent (a
    CA no handshake showed, by its name)."""
    needs: set[bytes] = set()
    ids: set[CertificateId] = set()
    for _ in range(_MAX_DEPTH):
        known = _BY_NAME.get(issuer)
        if known is None:
            needs.add(_name_key(issuer))
            break
        ca = _ca(known[0])
        ids.add(ca.identity)
        if ca.not_after < end:
            end, ending = ca.not_after, ca.subject
        if ca.issuer == ca.name or not known[1]:
            needs.add(_name_key(ca.name))
        if ca.issuer == ca.name:
            break
        issuer = ca.issuer
    return PeerChain(end, ending, _shared(frozenset(needs)), _shared(frozenset(ids)))


def trusted_keys(cafile: str) -> frozenset[bytes]:
    """The keys of the CAs of ``cafile`` (a file OpenSSL loaded), each by subject and public key, and by
    subject alone."""
    from cryptography import x509

    keys: set[bytes] = set()
    for certificate in x509.load_pem_x509_certificates(Path(cafile).read_bytes()):
        keys.add(_key(certificate))
        keys.add(_name_key(certificate.subject.public_bytes()))
    return frozenset(keys)


def certificate_id(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> CertificateId | None:
    """The issuer and serial number of the client's certificate (None: it sent none)."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    from cryptography import x509

    certificate = x509.load_der_x509_certificate(der)
    return certificate.issuer.public_bytes(), certificate.serial_number


_CRL_BLOCK = re.compile(rb"-----BEGIN X509 CRL-----.+?-----END X509 CRL-----", re.DOTALL)


def crls_in(crlfile: str) -> list[x509.CertificateRevocationList]:
    """The CRLs of a PEM file (one that OpenSSL loaded: each parses)."""
    from cryptography import x509

    return [x509.load_pem_x509_crl(block) for block in _CRL_BLOCK.findall(Path(crlfile).read_bytes())]


def revoked_in(crlfile: str) -> set[CertificateId]:
    """Every certificate the CRLs in ``crlfile`` list (the file loaded already: its CRLs parse)."""
    revoked: set[CertificateId] = set()
    for crl in crls_in(crlfile):
        issuer = crl.issuer.public_bytes()
        revoked.update((issuer, entry.serial_number) for entry in crl)
    return revoked
