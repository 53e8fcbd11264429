"""TLS for MQTT listeners and the admin endpoint: one place that turns configuration into an ``SSLContext``.

Devices authenticate the broker by its certificate; the broker may authenticate devices by theirs (mutual
TLS, ``require_client_cert``), in which case ``peer_common_name`` gives the identity the broker can use as
the username. TLS 1.2 is the floor by default because many device TLS stacks stop there.
"""

from __future__ import annotations

import datetime
import logging
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from broker_edge.config import ConfigError
from broker_edge.security.client_trust import ClientTrust
from broker_edge.security.peer_chain import crls_in

if TYPE_CHECKING:
    from cryptography import x509
from broker_edge.config.loader import expand_home

__all__ = [
    "ServerContexts",
    "TlsConfig",
    "certificate_end",
    "certificate_not_valid_now",
    "check_crls_cover",
    "client_ssl_context",
    "files_not_valid_now",
    "no_client_ca",
    "peer_common_name",
    "peer_timestone_uri",
    "server_ssl_context",
]

log = logging.getLogger("broker_edge.tls")

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CRL_CHECKS = {"leaf": ssl.VERIFY_CRL_CHECK_LEAF, "chain": ssl.VERIFY_CRL_CHECK_CHAIN}


@dataclass
class TlsConfig:
    """Server side TLS of one listener."""

    certfile: str
    """PEM file with the server certificate (then any intermediate certificates)."""
    keyfile: str
    """PEM file with the server's private key (unencrypted; protect it with file permissions)."""
    cafile: str | None = None
    """PEM file of the CA certificates that client certificates must chain to."""
    require_client_cert: bool = False
    """Refuse clients without a certificate signed by ``cafile`` (mutual TLS); needs ``cafile``."""
    min_version: Literal["TLSv1.2", "TLSv1.3"] = "TLSv1.2"
    """Oldest TLS version accepted."""
    crlfile: str | None = None
    """PEM file of the CRLs of the CAs in ``cafile`` (``timestone pki revoke``): a client certificate revoked
    there is refused; every CA issuing client certificates needs its CRL there, unexpired; re-read on SIGHUP;
    needs ``cafile``."""
    crl_check: Literal["leaf", "chain"] = "leaf"
    """What ``crlfile`` is checked for: ``leaf``, a client's own certificate; ``chain``, every certificate of
    its chain, its intermediate CAs too (then ``crlfile`` needs the CRL of every CA, the root's and those of
    the intermediates clients send, whom it refuses without it)."""

    def __post_init__(self) -> None:
        expand_home(self, "certfile", "keyfile", "cafile", "crlfile")
        for name in ("certfile", "keyfile"):
            if not getattr(self, name):
                raise ConfigError(name, "must name a PEM file")
        if self.min_version not in _VERSIONS:
            raise ConfigError(
                "min_version", f"expected one of {', '.join(_VERSIONS)}, got {self.min_version!r}"
            )
        if self.require_client_cert and not self.cafile:
            raise ConfigError(
                "cafile",
                "required when require_client_cert is true (client certificates are checked against it)",
            )
        if self.crlfile and not self.cafile:
            raise ConfigError(
                "cafile", "required with crlfile (the CRLs are of the CAs client certificates chain to)"
            )
        if self.crl_check not in _CRL_CHECKS:
            raise ConfigError("crl_check", f"expected leaf or chain, got {self.crl_check!r}")
        if self.crl_check == "chain" and not self.crlfile:
            raise ConfigError(
                "crlfile", "required with crl_check: chain (the CRLs its chain is checked against)"
            )


class EncryptedKey(ValueError):
    """A private key protected by a passphrase, which nothing here can give."""


def _no_passphrase() -> bytes:
    raise EncryptedKey("encrypted")


def load_key_pair(context: ssl.SSLContext, certfile: str, keyfile: str | None, key: str = "keyfile") -> None:
    """``context.load_cert_chain(certfile, keyfile)``, never asking for a passphrase: OpenSSL would ask on
    the terminal (a start, or a SIGHUP reload, that waits there) or fail naming nothing; an encrypted key is
    a ``ConfigError`` naming ``key``. ``ssl.SSLError`` as ``load_cert_chain`` raises it otherwise."""
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_passphrase)
    except EncryptedKey:
        raise ConfigError(
            key,
            f"{keyfile or certfile} is encrypted (protected by a passphrase): give an unencrypted key, "
            "readable by the broker only (mode 0600)",
        ) from None


def server_ssl_context(config: TlsConfig) -> ssl.SSLContext:
    """A server ``SSLContext`` for ``config``; errors name the config field of the file that is wrong.

    With a ``cafile`` but without ``require_client_cert`` a client certificate is optional but, when sent,
    must verify: a bad certificate fails the handshake instead of being silently ignored.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS[config.min_version]
    context.options |= ssl.OP_NO_COMPRESSION
    for name in ("certfile", "keyfile", "cafile", "crlfile"):
        path = getattr(config, name)
        if path is not None and not Path(path).is_file():
            raise ConfigError(name, f"file not found: {path}")
    try:
        load_key_pair(context, config.certfile, config.keyfile)
    except ssl.SSLError as exc:
        raise ConfigError(
            "certfile", f"cannot load certificate/key ({config.certfile}, {config.keyfile}): {exc}"
        ) from exc
    if config.cafile:
        try:
            context.load_verify_locations(cafile=config.cafile)
        except ssl.SSLError as exc:
            raise ConfigError("cafile", f"cannot load CA certificates from {config.cafile}: {exc}") from exc
        problem = no_client_ca(config.cafile)
        if problem:
            raise ConfigError("cafile", problem)
        context.verify_mode = ssl.CERT_REQUIRED if config.require_client_cert else ssl.CERT_OPTIONAL
        if config.crlfile:
            _load_crls(context, config.crlfile, _CRL_CHECKS[config.crl_check])
            check_crls_cover(config.cafile, config.crlfile, config.crl_check == "chain")
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def no_client_ca(cafile: str) -> str | None:
    """Why ``cafile`` can verify no client certificate, or None: every certificate in it is an end one
    (``basicConstraints`` CA:FALSE, issued by another), such as a server's or a client's own certificate put
    where its CA belongs, which the start took and then every client's handshake failed against."""
    from cryptography import x509

    try:
        certificates = x509.load_pem_x509_certificates(Path(cafile).read_bytes())
    except ValueError:
        return f"holds no PEM certificate: {cafile}"
    for certificate in certificates:
        try:
            constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            return None  # no constraints said: OpenSSL may take it as a CA
        if constraints.ca or certificate.subject == certificate.issuer:
            return None  # a CA, or a certificate trusted as itself
    names = "; ".join(certificate.subject.rfc4514_string() for certificate in certificates)
    return (
        f"holds no CA certificate, only end ones ({names}) that can verify no client's: name the file of "
        f"the CA that issued the clients' certificates (timestone pki: its ca.pem) in {cafile}'s place"
    )


def _load_crls(context: ssl.SSLContext, crlfile: str, check: ssl.VerifyFlags) -> None:
    """Check client certificates against the CRLs in ``crlfile``, as ``check`` says (a ``ConfigError``
    naming ``crlfile`` for a file holding none)."""
    text = Path(crlfile).read_bytes()
    if b"-----BEGIN X509 CRL-----" not in text:
        raise ConfigError(
            "crlfile", f"{crlfile} holds no CRL (PEM 'X509 CRL'): make it with timestone pki crl"
        )
    try:
        context.load_verify_locations(cafile=crlfile)
    except ssl.SSLError as exc:
        raise ConfigError("crlfile", f"cannot load the CRLs in {crlfile}: {exc}") from exc
    context.verify_flags |= check


def _checked_cas_and_crls(
    cafile: str, crlfile: str, chain: bool
) -> Iterator[tuple[str, list[x509.CertificateRevocationList]]]:
    """Each CA of ``cafile`` whose CRL is checked, by its name, with its CRLs in ``crlfile`` (signed by it):
    every CA when the ``chain`` is checked, else those that sign end certificates only (path length 0, as
    ``timestone pki ca`` makes them)."""
    from cryptography import x509

    crls = crls_in(crlfile)
    for ca in x509.load_pem_x509_certificates(Path(cafile).read_bytes()):
        try:
            constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            continue
        if not constraints.ca or (constraints.path_length != 0 and not chain):
            continue  # it may sign intermediate CAs, whose CRLs are the ones checked
        key = cast("Any", ca.public_key())  # a CA's key signs: never an X25519 or X448 one
        own = [crl for crl in crls if crl.issuer == ca.subject and crl.is_signature_valid(key)]
        yield ca.subject.rfc4514_string(), own


def check_crls_cover(cafile: str, crlfile: str, chain: bool = False) -> None:
    """``ConfigError`` naming ``crlfile`` when it holds no CRL of a CA of ``cafile`` whose CRL is checked
    (every CA when the ``chain`` is): OpenSSL would refuse every certificate of that CA ('unable to get
    certificate CRL')."""
    for subject, own in _checked_cas_and_crls(cafile, crlfile, chain):
        if not own:
            raise ConfigError(
                "crlfile",
                f"{crlfile} holds no CRL of the CA {subject} in {cafile}: every certificate it issued would "
                f"be refused; add its CRL (timestone pki crl --ca DIR, then cat the CRLs into {crlfile})",
            )


def _crl_expired(cafile: str, crlfile: str, chain: bool, now: datetime.datetime) -> str | None:
    """Why a CA of ``cafile`` has only expired CRLs in ``crlfile`` (every certificate it issued refused)."""
    for subject, own in _checked_cas_and_crls(cafile, crlfile, chain):
        if own and all(crl.next_update_utc is not None and crl.next_update_utc <= now for crl in own):
            return (
                f"the CRL of the CA {subject} in {crlfile} has expired: every certificate it issued is "
                "refused; write it again (timestone pki crl --ca DIR)"
            )
    return None


def client_ssl_context(certfile: str, keyfile: str, cafile: str, key: str) -> ssl.SSLContext:
    """A client ``SSLContext`` presenting ``certfile`` and ``keyfile``, trusting ``cafile``'s CAs only; a file
    that does not load is a ``ConfigError`` naming ``<key>.cafile`` or ``<key>.certfile``, and the file."""
    try:
        context = ssl.create_default_context(cafile=cafile)
    except OSError as exc:  # ssl.SSLError too: not PEM, no certificate in it
        raise ConfigError(f"{key}.cafile", f"cannot load CA certificates from {cafile}: {exc}") from None
    try:
        load_key_pair(context, certfile, keyfile, f"{key}.keyfile")
    except OSError as exc:
        raise ConfigError(
            f"{key}.certfile", f"cannot load certificate and key ({certfile}, {keyfile}): {exc}"
        ) from None
    return context


def certificate_not_valid_now(certfile: str, now: datetime.datetime | None = None) -> str | None:
    """Why the first certificate of ``certfile`` is not valid at ``now`` (expired, not valid yet), or None."""
    from cryptography import x509

    try:
        certificate = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
    except ValueError:
        return None  # not PEM: loading it says so
    now = now or datetime.datetime.now(datetime.UTC)
    if certificate.not_valid_after_utc <= now:
        return f"{certfile} expired at {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    if certificate.not_valid_before_utc > now:
        return f"{certfile} is not valid before {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    return None


def not_for_servers(certfile: str) -> str | None:
    """Why the first certificate of ``certfile`` cannot serve TLS, or None: an extended key usage without
    serverAuth (a client's or a site's certificate), which every client refuses in its handshake. A
    certificate without the extension is good for any use."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    try:
        certificate = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (ValueError, x509.ExtensionNotFound):
        return None  # not PEM (loading it says so), or good for any use
    if ExtendedKeyUsageOID.SERVER_AUTH in usages or ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in usages:
        return None
    names = {ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth", ExtendedKeyUsageOID.CODE_SIGNING: "codeSigning"}
    named = ", ".join(names.get(usage, usage.dotted_string) for usage in usages) or "none"
    return (
        f"{certfile} is not a server's certificate: its extended key usage ({named}) has no serverAuth, "
        "so every client refuses it; issue one with `timestone pki issue server`"
    )


def certificate_uris(certfile: str) -> tuple[list[str], datetime.datetime]:
    """The URI subject alternative names of the first certificate of ``certfile`` (where a member's and a
    site's certificates say who they are), and when it expires; ``ValueError`` when it holds no PEM
    certificate."""
    from cryptography import x509

    certificate = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    return uris, certificate.not_valid_after_utc


def certificate_end(certfile: str) -> float:
    """When the first certificate of ``certfile`` expires (Unix time; 0.0 when it does not parse)."""
    from cryptography import x509

    try:
        certificate = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
    except (OSError, ValueError):
        return 0.0
    return certificate.not_valid_after_utc.timestamp()


RENEW = "clients refuse it; renew it (timestone pki renew CERT --ca DIR)"


def files_not_valid_now(files: TlsConfig, now: datetime.datetime | None = None) -> tuple[str, str] | None:
    """The key of a file of ``files`` that does not hold now, and why: a server certificate expired or not
    valid yet, a CA's CRL expired. A start serves them (said at ERROR); ``broker --check`` and a reload
    refuse them."""
    now = now or datetime.datetime.now(datetime.UTC)
    problem = certificate_not_valid_now(files.certfile, now)
    if problem:
        return "certfile", f"{problem}: {RENEW}"
    if files.cafile and files.crlfile:
        problem = _crl_expired(files.cafile, files.crlfile, files.crl_check == "chain", now)
        if problem:
            return "crlfile", problem
    return None


class ServerContexts:
    """A server's TLS whose certificate, key and CAs can be replaced while it serves (SIGHUP).

    The server is given ``context``, whose only job is its SNI callback: OpenSSL calls it for every
    ClientHello (with or without a server name), and it switches the handshake to ``current``. ``reload``
    builds a new ``current`` from the files; connections already open keep theirs, new ones get the new
    certificate and are checked against the new CAs (during a rotation, a CA file holding the old and the
    new CA accepts both). A reload that fails raises and leaves ``current`` as it was; so does one whose
    ``certfile`` (the server's certificate) has expired or is not valid yet, which a start serves all the
    same, said at ERROR. ``trust``: the client certificates its CAs and CRLs accept as of the last reload,
    read with each new ``current`` (by default of ``files``' ``cafile`` and ``crlfile``; None without
    ``cafile``), for the checks OpenSSL does not make again (``client_trust``)."""

    def __init__(
        self,
        build: Callable[[], ssl.SSLContext],
        files: TlsConfig | None = None,
        name: str = "TLS server",
        trust: ClientTrust | None = None,
    ) -> None:
        self._build = build
        self._files = files
        self.name = name
        """What the log lines call it (``listener devices``, ``offsets API``)."""
        if trust is None and files is not None and files.cafile:
            trust = ClientTrust(files.cafile, files.crlfile, files.crl_check == "chain")
        self.trust = trust
        self.current = build()
        self.not_after = certificate_end(files.certfile) if files else 0.0
        """When the certificate served now expires (Unix time; 0: not known)."""
        problem = files_not_valid_now(files) if files else None
        if problem:
            log.error("%s: %s: %s", name, *problem)
        self._warn_if_key_readable()
        self.context = build()
        self.context.sni_callback = self._switch
        self.reloads = 0

    @property
    def files(self) -> TlsConfig | None:
        """The files it is read from (None: built otherwise)."""
        return self._files

    def _switch(self, ssl_object: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext) -> None:
        ssl_object.context = self.current

    def reload(self) -> None:
        problem = files_not_valid_now(self._files) if self._files else None
        if problem:
            raise ConfigError(*problem)
        current = self._build()
        if self.trust is not None:
            self.trust.reload()  # raises (as the build may): neither changes
        self.current = current
        self.reloads += 1
        if self._files:
            self.not_after = certificate_end(self._files.certfile)
        self._warn_if_key_readable()

    def _warn_if_key_readable(self) -> None:
        """A WARNING when every user may read the key (as for a password file): it works, and leaks."""
        if self._files is None:
            return
        try:
            mode = Path(self._files.keyfile).stat().st_mode & 0o777
        except OSError:
            return
        if mode & 0o004:
            log.warning(
                "%s: tls.keyfile %s is readable by every user (mode %o): use 0600, or 0640 with the group of "
                "the broker's user",
                self.name,
                self._files.keyfile,
                mode,
            )


def peer_common_name(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The subject CN of the verified client certificate, or ``None`` when the client sent none.

    Only meaningful when the context verifies client certificates (``cafile`` set): with ``CERT_NONE``
    Python does not expose the peer certificate at all.
    """
    if ssl_object is None:
        return None
    certificate = ssl_object.getpeercert()
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for attribute in rdn:  # (name, value) pairs
            if attribute[0] == "commonName":
                return str(attribute[1])
    return None


def peer_timestone_uri(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str:
    """The ``timestone://`` URI the client's certificate names (a cluster member's ``timestone://node/...``,
    a site's ``timestone://site/...``), or "": such a certificate is never a device's login."""
    certificate = ssl_object.getpeercert() if ssl_object is not None else None
    names = certificate.get("subjectAltName", ()) if certificate else ()
    for kind, value in cast("tuple[tuple[str, str], ...]", names):
        if kind == "URI" and value.startswith("timestone://"):
            return value
    return ""
