"""Certificates a CA has revoked, and the CRL that tells TLS listeners about them.

``timestone pki revoke CERT --ca DIR`` adds a certificate the CA issued (a device's whose key was stolen,
a retired gateway's) to ``DIR/revoked.json`` (serial, subject, when) and writes ``DIR/crl.pem`` again: a
CRL signed by the CA that lists every certificate it revoked. A listener whose ``tls.crlfile`` names it
refuses those certificates at the handshake; SIGHUP reads it again. ``timestone pki crl --ca DIR`` writes
it again from ``revoked.json`` (the first time, with none revoked).

A listener checking CRLs refuses every client certificate of a CA whose CRL has expired, so the CRL is made
valid until the CA itself ends: it needs writing again only when a certificate is revoked.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.serialization import Encoding

from broker_edge.pki.authority import Authority, PkiError, read_certificates
from broker_edge.security.replace_files import replace_files

__all__ = ["CRL_FILE", "REVOKED_FILE", "revoke", "revoked_of", "write_crl"]

CRL_FILE = "crl.pem"
REVOKED_FILE = "revoked.json"
_PUBLIC = 0o644
"""The CRL and the list are read by every service that checks certificates: nothing secret in them."""


def revoked_of(authority: Authority) -> list[dict[str, str]]:
    """The certificates ``authority`` revoked, oldest first: ``serial`` (hex), ``subject``, ``revoked_at``."""
    path = authority.directory / REVOKED_FILE
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except ValueError as error:
        raise PkiError(f"{path} does not read as the list of revoked certificates: {error}") from None
    if not isinstance(entries, list) or not all(
        isinstance(entry, dict) and isinstance(entry.get("serial"), str) for entry in entries
    ):
        raise PkiError(f"{path} does not read as the list of revoked certificates")
    for number, entry in enumerate(entries, 1):  # (a list edited by hand: each entry read as the CRL will)
        why = _unreadable(entry)
        if why:
            raise PkiError(f"{path}: entry {number}: {why}")
    return entries


def _unreadable(entry: Mapping[str, object]) -> str | None:
    """Why an entry of the list cannot go in a CRL, or None."""
    serial = entry["serial"]
    try:
        if not 0 < _serial(entry) < 1 << 159:  # (RFC 5280: positive, at most 20 octets)
            raise ValueError(serial)
    except ValueError:
        return f"serial {serial!r} is not a serial number in hex"
    revoked_at = entry.get("revoked_at")
    if revoked_at is not None:
        try:
            datetime.datetime.fromisoformat(revoked_at if isinstance(revoked_at, str) else "")
        except ValueError:
            return f"revoked_at {revoked_at!r} is not a date and time (2026-11-30T10:00:00+00:00)"
    return None


def _serial(entry: Mapping[str, object]) -> int:
    """An entry's serial number (hex, as openssl x509 -serial prints it too, in upper case)."""
    return int(str(entry["serial"]), 16)


def revoke(authority: Authority, cert: str | Path) -> tuple[x509.Certificate, Path, bool]:
    """Revoke the certificate in ``cert`` (issued by ``authority``) and write the CRL again; returns the
    certificate, the CRL's path and whether it was newly revoked (False: it was already)."""
    certificate = read_certificates(cert)[0]  # (a file with its chain: the certificate comes first)
    try:
        certificate.verify_directly_issued_by(authority.certificate)
    except (ValueError, TypeError, InvalidSignature) as error:
        raise PkiError(f"{cert} was not issued by the CA in {authority.directory} ({error})") from None
    if certificate.serial_number == authority.certificate.serial_number:
        raise PkiError(f"{cert} is the CA itself: a CA is replaced, not revoked (docs/security.md)")
    serial = format(certificate.serial_number, "x")
    with _editing(authority):
        entries = revoked_of(authority)
        added = all(_serial(entry) != certificate.serial_number for entry in entries)
        if added:
            now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
            subject = certificate.subject.rfc4514_string()
            entries.append({"serial": serial, "subject": subject, "revoked_at": now.isoformat()})
        return certificate, _write(authority, entries), added


def write_crl(authority: Authority) -> Path:
    """Write ``authority``'s CRL again from its list of revoked certificates; returns its path."""
    with _editing(authority):
        return _write(authority, revoked_of(authority))


@contextlib.contextmanager
def _editing(authority: Authority) -> Iterator[None]:
    """An exclusive lock on ``DIR/.revoked.json.lock``, held while the list is read, added to and written
    with the CRL: revocations run side by side (``xargs -P``) wait for each other, none lost. (Not a lock
    on the list itself, which is replaced by a rename; the lock file is left in place.)"""
    path = authority.directory / f".{REVOKED_FILE}.lock"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _write(authority: Authority, entries: list[dict[str, str]]) -> Path:
    """The list and the CRL made from it, both replaced together."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(authority.certificate.subject)
        .last_update(now - datetime.timedelta(minutes=5))  # a listener's clock a little behind still takes it
        .next_update(max(authority.certificate.not_valid_after_utc, now + datetime.timedelta(days=1)))
    )
    for entry in entries:
        revoked_at = datetime.datetime.fromisoformat(entry.get("revoked_at") or now.isoformat())
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(_serial(entry)).revocation_date(revoked_at).build()
        )
    crl = authority.sign_crl(builder)
    path = authority.directory / CRL_FILE
    listing = (json.dumps(entries, indent=2) + "\n").encode()
    pem = crl.public_bytes(Encoding.PEM)
    replace_files([(authority.directory / REVOKED_FILE, listing, _PUBLIC), (path, pem, _PUBLIC)])
    return path
