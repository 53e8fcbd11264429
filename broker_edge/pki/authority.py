"""A CA kept in a directory, and every kind of certificate a production configuration names.

``Authority.create(directory)`` writes ``ca.pem`` and ``ca.key`` (the directory 0711, the key 0600);
``Authority(directory)`` opens them to issue the kinds of ``KINDS``:

- ``server``: CN and ``--dns``/``--ip``; a TLS server (MQTT listeners, the offsets API, an uplink hub);
- ``member``: ``timestone://node/<node_id>``; a cluster member, serving and connecting (``cluster.tls``);
- ``site``: ``timestone://site/<site_id>``; an uplink site, connecting (``uplink.tls``);
- ``client``: a CN only; a device on a listener that requires certificates (the CN is its user name), or
  an etcd user (etcd takes the CN as the user: the cluster's etcd user, ``root`` for ``etcdctl``);
- ``etcd``: CN and ``--dns``/``--ip``; an etcd member's server and peer certificate.

A new certificate gets a new key. ``renew`` issues the next certificate of one that exists (the same names
and uses, a new key and validity) and replaces both files whole, together (both or, on a failure, neither;
each keeping its owner, group and mode): a broker sent SIGHUP then serves it, and clients that trust the CA
accept both. A CA is replaced the same way, by a second one trusted beside it
during the switch (docs/security.md, Certificates).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker_edge.cluster.links.member_identity import MEMBER_URI_PREFIX, member_uri
from broker_edge.pki.builders import (
    KeyType,
    LeafKey,
    PrivateKey,
    build_ca,
    build_leaf,
    key_like,
    new_key,
    subject_name,
    write_pair,
)
from broker_edge.security.replace_files import NotReplaced
from broker_edge.settings.cluster import NODE_ID
from broker_edge.settings.uplink import SITE_ID
from broker_edge.uplink.site_identity import SITE_URI_PREFIX, site_uri

__all__ = ["KINDS", "Authority", "Kind", "PemPair", "PkiError", "describe"]


#: A CA's directory: others may reach ``ca.pem`` by its path (a service running as its own user trusts it,
#: cluster.tls.cafile), not list the directory; the key in it is 0600.
CA_DIRECTORY_MODE = 0o711


class PkiError(Exception):
    """What cannot be issued, and why (a message for the operator)."""


@dataclass(frozen=True)
class PemPair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


def _no_uri(_name: str) -> str | None:
    return None


def _checked(
    pattern_name: str, pattern: re.Pattern[str], uri: Callable[[str], str]
) -> Callable[[str], str | None]:
    def named(name: str) -> str | None:
        if not pattern.match(name):
            raise PkiError(f"{name!r} is not a {pattern_name} (letters, digits, '_', '.', '-'; at most 63)")
        return uri(name)

    return named


@dataclass(frozen=True)
class Kind:
    """What one kind of certificate names and may do."""

    serves: bool
    connects: bool
    uri: Callable[[str], str | None]
    """The URI subject alternative name its NAME becomes (None: none)."""
    addresses: bool
    """Whether it names the host names and addresses its clients reach (``--dns``, ``--ip``; one at least)."""
    summary: str


KINDS: dict[str, Kind] = {
    "server": Kind(
        True,
        False,
        _no_uri,
        True,
        "a TLS server: an MQTT listener (tls, wss), the offsets API, an uplink hub; --dns and --ip are the "
        "names and addresses its clients reach it by",
    ),
    "member": Kind(
        True,
        True,
        _checked("node id", NODE_ID, member_uri),
        False,
        "a cluster member (cluster.tls): NAME is its cluster.node_id, named as timestone://node/NAME",
    ),
    "site": Kind(
        False,
        True,
        _checked("site id", SITE_ID, site_uri),
        False,
        "an uplink site (uplink.tls): NAME is its uplink.site_id, named as timestone://site/NAME",
    ),
    "client": Kind(
        False,
        True,
        _no_uri,
        False,
        "a client whose subject CN is NAME: a device on a listener that requires client certificates (the CN "
        "is its user name), a reader of an offsets API that asks for one (the Spark source's certFile, "
        "keyFile), an etcd user (etcd takes the CN as the user: the cluster's etcd user, root for etcdctl)",
    ),
    "etcd": Kind(
        True,
        True,
        _no_uri,
        True,
        "an etcd member's server and peer certificate (--cert-file, --peer-cert-file): it serves, and "
        "connects to its peers and its own gateway; --dns and --ip are its addresses",
    ),
}


#: A host name a certificate may name: labels of letters, digits and '-', a leading "*." for a wildcard.
_HOST_NAME = re.compile(
    r"(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
#: The longest value of a subject's CN or O (RFC 5280's upper bound).
MAX_NAME = 64


def _host_name(name: str) -> str:
    """``--dns``'s name as a certificate holds it: an internationalized name as its A-label
    (``bücher.example`` is ``xn--bcher-kva.example``)."""
    try:
        ascii_name = name if name.isascii() else name.encode("idna").decode("ascii")
    except UnicodeError:
        raise PkiError(f"--dns {name!r}: not a host name") from None
    if len(ascii_name) > 253 or not _HOST_NAME.fullmatch(ascii_name):
        raise PkiError(f"--dns {name!r}: not a host name (letters, digits, '-' and '.', '*.' to begin)")
    return ascii_name


def _addresses(dns: Iterable[str], ips: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(_host_name(name)) for name in dns]
    for address in ips:
        if "%" in address:
            raise PkiError(f"--ip {address!r}: a zone (%...) is this host's, no certificate can name it")
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            raise PkiError(f"--ip {address!r}: not an IPv4 or IPv6 address") from None
    return names


def _subject_value(what: str, value: str) -> str:
    if not 1 <= len(value) <= MAX_NAME:
        raise PkiError(
            f"{what} {value!r}: from 1 to {MAX_NAME} characters in a certificate, got {len(value)}"
        )
    return value


class Authority:
    """The CA in ``directory`` (``ca.pem``, ``ca.key``), which issues the certificates of ``KINDS``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if self.directory.is_file():  # its ca.pem, as a listener's cafile names it
            parent = self.directory.parent
            raise PkiError(f"--ca {directory} is a file: --ca names the CA's directory ({parent})")
        self.ca = PemPair(self.directory / "ca.pem", self.directory / "ca.key")
        if not self.ca.cert.exists() and not self.ca.key.exists():
            raise PkiError(
                f"no CA in {self.directory} (ca.pem and ca.key): make one with timestone pki ca {directory}"
            )
        key = _load_ca_key(self.ca.key)
        chain = read_certificates(self.ca.cert, missing=_CA_FILES)
        if not isinstance(key, PrivateKey):
            raise PkiError(f"{self.ca.key}: an EC or RSA key was expected")
        self.certificate = chain[0]
        self.intermediates = tuple(
            certificate for certificate in chain if certificate.issuer != certificate.subject
        )
        """The CAs of ``ca.pem`` that are no root (an intermediate's ``ca.pem``: itself, then its root),
        written after every certificate issued: peers trusting the root alone need them (none for a root)."""
        if not _is_key_of(key, self.certificate):  # what it signed no cafile holding ca.pem would trust
            raise PkiError(f"{self.ca.key} is not the key of {self.ca.cert}: put the CA's own key there")
        not_a_ca = _why_not_a_ca(self.certificate)
        if not_a_ca:
            raise PkiError(
                f"{self.ca.cert} is not a CA's certificate ({not_a_ca}): TLS peers refuse what it signs "
                "(invalid CA certificate)"
            )
        self._key: PrivateKey = key
        organization = self.certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
        self.organization = str(organization[0].value) if organization else "Timestone"

    @classmethod
    def create(
        cls, directory: str | Path, name: str | None = None, days: int = 3650, key_type: KeyType = "ec"
    ) -> Authority:
        """A new CA in ``directory`` (made 0711 when the command makes it: not listed, its certificate read
        by path by the services that trust it; its key 0600), named ``name`` (default: the directory's
        name); an existing CA is never overwritten, and a directory that existed keeps its mode (``/tmp``
        stays 1777, a 0700 one is not opened to others)."""
        folder = Path(directory)
        _check_days(days)
        organization = _subject_value("--name", name or folder.resolve().name)
        _subject_value("--name", f"{organization} CA")  # its CN
        if folder.is_file():
            raise PkiError(f"{folder} is a file: timestone pki ca makes the CA's directory")
        made = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)
        there = f"{folder} already holds a CA (ca.pem, ca.key): it is never replaced in place"
        if (folder / "ca.key").exists() or (folder / "ca.pem").exists():
            raise PkiError(there)
        if made:
            os.chmod(folder, CA_DIRECTORY_MODE)
        key, certificate = build_ca(subject_name(f"{organization} CA", organization), days, new_key(key_type))
        try:  # made, never replaced: another pki ca run at the same time may have made one since the check
            write_pair(folder / "ca.pem", folder / "ca.key", key, certificate, new=True)
        except FileExistsError:
            raise PkiError(there) from None
        return cls(folder)

    def sign_crl(self, builder: x509.CertificateRevocationListBuilder) -> x509.CertificateRevocationList:
        """``builder`` signed by the CA's key, with SHA-256 (``revocation``)."""
        return builder.sign(self._key, hashes.SHA256())

    def issue(
        self,
        kind: str,
        name: str,
        *,
        dns: Iterable[str] = (),
        ips: Iterable[str] = (),
        days: int = 365,
        key_type: KeyType = "ec",
        out: str | Path | None = None,
        replace: bool = False,
    ) -> PemPair:
        """A new certificate of ``kind`` for ``name`` and its key, written to ``out`` (a path without its
        suffix: ``<out>.pem``, ``<out>.key``; a directory: ``<out>/<kind>-<name>``, as by default in the CA's
        directory)."""
        if kind not in KINDS:
            raise PkiError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
        what = KINDS[kind]
        if not name or "/" in name or any(character.isspace() for character in name):
            raise PkiError(f"{name!r}: a name is one word without '/'")
        _subject_value("NAME", name)
        _check_days(days)
        names = _addresses(dns, ips)
        if what.addresses and not names:
            raise PkiError(f"a {kind} certificate names where it is reached: give --dns and/or --ip")
        uri = what.uri(name)
        if uri is not None:
            names.insert(0, x509.UniformResourceIdentifier(uri))
        stem: str | Path = self.directory if out is None else out
        if out is None or str(out).endswith("/") or Path(out).is_dir():  # files of their own in a directory
            stem = Path(stem) / f"{kind}-{name}"
        pair = self._pair(stem)
        self._check_not_the_ca(pair)
        if not replace and (pair.cert.exists() or pair.key.exists()):
            raise PkiError(
                f"{pair.cert} or {pair.key} exists: renew it (timestone pki renew) or pass --force"
            )
        subject = subject_name(name, self.organization)
        key, certificate = self.sign(
            subject,
            server=what.serves,
            client=what.connects,
            names=tuple(names),
            days=days,
            key_type=key_type,
        )
        self._write(pair, key, certificate)
        return pair

    def sign(
        self,
        subject: x509.Name,
        *,
        server: bool,
        client: bool,
        names: tuple[x509.GeneralName, ...] = (),
        days: int = 365,
        key_type: KeyType = "ec",
        usages: Sequence[x509.ObjectIdentifier] | None = None,
        key: LeafKey | None = None,
    ) -> tuple[LeafKey, x509.Certificate]:
        """A new key (``key_type``, or ``key`` as it is) and a certificate of this CA for it, of any shape
        (``issue`` makes the usual ones; ``usages``, the extended key usages as they are:
        ``builders.build_leaf``); refused while the CA is not valid, or when it would expire before the
        certificate."""
        self._check_validity(days)
        return build_leaf(
            self._key,
            self.certificate,
            subject,
            server=server,
            client=client,
            names=names,
            days=days,
            key=key if key is not None else new_key(key_type),
            usages=usages,
        )

    def renew(
        self,
        cert: str | Path,
        key: str | Path | None = None,
        days: int = 365,
        key_type: KeyType | None = None,
    ) -> PemPair:
        """The next certificate of the one in ``cert`` (issued by this CA): its subject, names and uses, a
        new key (of the same kind, ``builders.key_like``, unless ``key_type``) and ``days`` of validity;
        both files replaced whole.
        ``key`` defaults to ``cert`` with ``.key`` for ``.pem``."""
        cert_path = Path(cert)
        pair = PemPair(cert_path, Path(key) if key is not None else cert_path.with_suffix(".key"))
        try:
            current = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        except FileNotFoundError:
            raise PkiError(f"{pair.cert}: no such certificate") from None
        except ValueError as error:
            raise PkiError(f"{pair.cert}: not a PEM certificate ({error})") from None
        _check_extensions_parse(pair.cert, current)
        constraints = _extension(current, x509.BasicConstraints)
        if isinstance(constraints, x509.BasicConstraints) and constraints.ca:
            raise PkiError(
                f"{pair.cert} is a CA: a CA is not renewed, it is replaced by a new one trusted beside it "
                "during the switch (docs/security.md, Certificates)"
            )
        try:
            current.verify_directly_issued_by(self.certificate)
        except (ValueError, TypeError, InvalidSignature):
            raise PkiError(
                f"{pair.cert} was not issued by the CA in {self.directory} (its signature is not that CA's): "
                "renew it with the CA that issued it"
            ) from None
        self._check_not_the_ca(pair)
        _check_key_of(pair, current)
        _check_days(days)
        usages = _extension(current, x509.ExtendedKeyUsage)
        names = _extension(current, x509.SubjectAlternativeName)
        assert usages is None or isinstance(usages, x509.ExtendedKeyUsage)
        assert names is None or isinstance(names, x509.SubjectAlternativeName)
        new, certificate = self.sign(
            current.subject,
            server=False,
            client=False,
            names=tuple(names) if names is not None else (),
            days=days,
            usages=list(usages) if usages is not None else [],  # as they were: none is any use
            key=new_key(key_type) if key_type else key_like(current.public_key()),
        )
        self._write(pair, new, certificate)
        return pair

    def _check_validity(self, days: int) -> None:
        """A certificate is accepted only while its CA is: refuse one that is not, at any time of its own."""
        now = datetime.datetime.now(datetime.UTC)
        path = self.intermediates or (self.certificate,)  # an intermediate holds only while those above do
        start = max(certificate.not_valid_before_utc for certificate in path)
        end = min(certificate.not_valid_after_utc for certificate in path)
        valid = f"valid from {start:%Y-%m-%d %H:%M} until {end:%Y-%m-%d %H:%M} UTC"
        replace = "replace the CA by a new one trusted beside it (docs/security.md, Certificates)"
        if now < start:
            raise PkiError(
                f"the CA in {self.directory} is not valid yet ({valid}): no TLS peer would accept what it "
                f"signs now; check this machine's clock, or {replace}"
            )
        if now >= end:
            raise PkiError(
                f"the CA in {self.directory} has expired ({valid}): no TLS peer accepts what it signs; "
                f"{replace}"
            )
        left = (end - now).days
        if now + datetime.timedelta(days=days) > end:
            shorter = f"give --days {left} or fewer, or " if left >= 1 else ""
            raise PkiError(
                f"the CA in {self.directory} expires before a certificate of --days {days} would ({valid}, "
                f"{left} days left): {shorter}{replace}"
            )

    def _check_not_the_ca(self, pair: PemPair) -> None:
        """Nothing issued or renewed is written over this CA's own files."""
        for path in (pair.cert, pair.key):
            for own in (self.ca.cert, self.ca.key):
                try:
                    same = os.path.samefile(path, own)
                except OSError:
                    same = False
                if same:
                    raise PkiError(
                        f"{path} is the CA's own {own.name} in {self.directory}: it is never overwritten "
                        "(a CA is replaced by a new one trusted beside it: docs/security.md, Certificates)"
                    )

    @staticmethod
    def _pair(out: str | Path) -> PemPair:
        stem = Path(out)
        if stem.suffix in (".pem", ".key", ".crt"):
            stem = stem.with_suffix("")
        stem.parent.mkdir(parents=True, exist_ok=True)
        return PemPair(stem.with_name(stem.name + ".pem"), stem.with_name(stem.name + ".key"))

    def _write(self, pair: PemPair, key: LeafKey, certificate: x509.Certificate) -> None:
        try:
            write_pair(pair.cert, pair.key, key, certificate, *self.intermediates)
        except NotReplaced as error:
            raise PkiError(
                f"cannot write {error.filename} ({error.strerror}): nothing was replaced, {pair.cert} and "
                f"{pair.key} are as they were"
            ) from None


def _check_days(days: int) -> None:
    if not 1 <= days <= 36_500:
        raise PkiError(f"--days must be within [1, 36500], got {days}")


def _check_key_of(pair: PemPair, certificate: x509.Certificate) -> None:
    """The key file renewed beside a certificate, when there is one, is that certificate's key."""
    try:
        key = serialization.load_pem_private_key(pair.key.read_bytes(), None)
    except FileNotFoundError:
        return
    except (ValueError, TypeError) as error:
        raise PkiError(
            f"{pair.key}: not an unencrypted PEM key ({error}); give its key with --key-file"
        ) from None
    if not _is_key_of(key, certificate):
        raise PkiError(f"{pair.key} is not the key of {pair.cert}: give its key with --key-file")


def _is_key_of(key: PrivateKeyTypes, certificate: x509.Certificate) -> bool:
    """Whether ``key`` is the private key of ``certificate``'s public key."""
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(*spki) == certificate.public_key().public_bytes(*spki)


def _why_not_a_ca(certificate: x509.Certificate) -> str | None:
    """Why TLS peers (OpenSSL) take ``certificate`` for no CA, or None: a v3 one needs basicConstraints
    CA:TRUE, and keyCertSign if it has a key usage; a v1 self-signed one (openssl req -x509 without
    extensions) is a CA to them."""
    usage = _extension(certificate, x509.KeyUsage)
    if isinstance(usage, x509.KeyUsage) and not usage.key_cert_sign:
        return "its key usage has no keyCertSign"
    constraints = _extension(certificate, x509.BasicConstraints)
    if isinstance(constraints, x509.BasicConstraints):
        return None if constraints.ca else "basicConstraints CA:FALSE"
    if certificate.version == x509.Version.v1:
        return None
    return "no basicConstraints CA:TRUE"


def _check_extensions_parse(path: str | Path, certificate: x509.Certificate) -> None:
    """``PkiError`` for a certificate whose extensions are no valid DER (cryptography parses them late)."""
    try:
        certificate.extensions  # noqa: B018  (parsed on first access)
    except ValueError as error:
        raise PkiError(f"{path}: its extensions do not parse ({error})") from None


def _extension(certificate: x509.Certificate, kind: type) -> object | None:
    try:
        return certificate.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


_CA_FILES = "a CA's directory holds its certificate, ca.pem, and its key, ca.key"


def _load_ca_key(path: Path) -> PrivateKeyTypes:
    """The CA's private key in ``path``; ``PkiError`` naming the file and what it holds instead."""
    try:
        data = path.read_bytes()
        return serialization.load_pem_private_key(data, None)
    except FileNotFoundError:
        raise PkiError(f"{path}: no such file ({_CA_FILES})") from None
    except TypeError:  # a passphrase is asked for
        raise PkiError(
            f"{path}: an encrypted key (a passphrase): timestone pki reads an unencrypted one "
            f"(openssl pkey -in ENCRYPTED -out {path}), kept 0600"
        ) from None
    except ValueError:
        holds = "a certificate, not a private key" if _CERTIFICATE_LABEL in data else "no PEM private key"
        raise PkiError(f"{path}: {holds}") from None


def read_certificates(path: str | Path, missing: str = "") -> list[x509.Certificate]:
    """The certificates of a PEM file, first to last; ``PkiError`` for a file that is not there (said with
    ``missing`` in brackets) or holds none."""
    try:
        data = Path(path).read_bytes()
        return x509.load_pem_x509_certificates(data)
    except FileNotFoundError:
        raise PkiError(f"{path}: no such file" + (f" ({missing})" if missing else "")) from None
    except ValueError:
        raise PkiError(f"{path}: {_not_a_certificate(data, Path(path))}") from None


def _not_a_certificate(data: bytes, path: Path) -> str:
    """What a file that holds no PEM certificate holds instead, as far as its PEM label (or DER) says."""
    if b"PRIVATE KEY-----" in data:
        return "a private key, not a certificate"
    if _CRL_LABEL in data:
        return "a CRL, not a certificate"
    for what, command, load in (
        ("a certificate", "x509", x509.load_der_x509_certificate),
        ("a CRL", "crl", x509.load_der_x509_crl),
    ):
        with contextlib.suppress(ValueError):
            load(data)
            pem = path.with_suffix(".pem") if path.suffix != ".pem" else path.with_suffix(".pem.pem")
            return f"{what} in DER, not PEM: openssl {command} -inform der -in {path} -out {pem}"
    return "no PEM certificate"


_CRL_LABEL = b"-----BEGIN X509 CRL-----"
_CERTIFICATE_LABEL = b"-----BEGIN CERTIFICATE-----"


def _describe_crl(crl: x509.CertificateRevocationList, now: datetime.datetime) -> list[str]:
    """What a CRL says: whose, which serials, when it was written and until when it holds."""
    serials = [f"{entry.serial_number:x}" for entry in crl]
    shown = ", ".join(serials[:10]) + (f" and {len(serials) - 10} more" if len(serials) > 10 else "")
    count = f"{len(serials)} certificate{'' if len(serials) == 1 else 's'}"
    lines = [
        f"CRL of:   {crl.issuer.rfc4514_string()}",
        f"revoked:  {count}{': serial ' if serials else ''}{shown}",
    ]
    lines.append(f"updated:  {crl.last_update_utc:%Y-%m-%d %H:%M} UTC")
    if crl.next_update_utc is not None:
        end = crl.next_update_utc
        left = (
            f"expired {_span(now - end)} ago: listeners refuse its CA's certificates"
            if end <= now
            else (f"{_span(end - now)} left")
        )
        lines.append(f"valid:    until {end:%Y-%m-%d %H:%M} UTC ({left})")
    return lines


def _span(delta: datetime.timedelta) -> str:
    """``delta`` in whole days, else hours: ``3 days``, ``1 hour``, ``less than an hour``."""
    for unit, size in (("day", delta.days), ("hour", delta.seconds // 3600)):
        if size:
            return f"{size} {unit}{'s' if size > 1 else ''}"
    return "less than an hour"


def _validity(certificate: x509.Certificate, now: datetime.datetime) -> str:
    """``timestone pki show``'s line of when ``certificate`` holds, as seen at ``now``."""
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    until = f"until {end:%Y-%m-%d %H:%M} UTC"
    if now < start:
        return (
            f"valid:    from {start:%Y-%m-%d %H:%M} UTC {until} (not valid yet: the clock is behind, or it "
            "was issued for later)"
        )
    if end <= now:
        return f"valid:    {until} (expired {_span(now - end)} ago)"
    return f"valid:    {until} ({_span(end - now)} left)"


def describe(path: str | Path, now: datetime.datetime | None = None) -> list[str]:
    """What the certificates of a PEM file name, for whom, and until when, or the serials a CRL lists
    (``timestone pki show``)."""
    now = now or datetime.datetime.now(datetime.UTC)
    crl: list[str] = []  # (a CRL anywhere in the file: after openssl crl -text's text, a CA's certificate)
    with contextlib.suppress(OSError, ValueError):
        data = Path(path).read_bytes()
        if _CRL_LABEL in data:
            crl = _describe_crl(x509.load_pem_x509_crl(data), now)
    if crl and _CERTIFICATE_LABEL not in data:
        return crl
    certificates = read_certificates(path)
    lines: list[str] = []
    for certificate in certificates:
        _check_extensions_parse(path, certificate)
        lines.append(f"subject:  {certificate.subject.rfc4514_string()}")
        lines.append(f"issuer:   {certificate.issuer.rfc4514_string()}")
        lines.append(_validity(certificate, now))
        constraints = _extension(certificate, x509.BasicConstraints)
        if isinstance(constraints, x509.BasicConstraints) and constraints.ca:
            lines.append("is:       a CA")
        usages = _extension(certificate, x509.ExtendedKeyUsage)
        if isinstance(usages, x509.ExtendedKeyUsage):
            uses = {ExtendedKeyUsageOID.SERVER_AUTH: "serves", ExtendedKeyUsageOID.CLIENT_AUTH: "connects"}
            lines.append(f"uses:     {', '.join(uses.get(usage, usage.dotted_string) for usage in usages)}")
        names = _extension(certificate, x509.SubjectAlternativeName)
        if isinstance(names, x509.SubjectAlternativeName):
            shown = [f"DNS:{n}" for n in names.get_values_for_type(x509.DNSName)]
            shown += [f"IP:{n}" for n in names.get_values_for_type(x509.IPAddress)]
            uris = names.get_values_for_type(x509.UniformResourceIdentifier)
            shown += [f"URI:{n}" for n in uris]
            lines.append(f"names:    {', '.join(shown)}")
            for uri in uris:
                if uri.startswith(MEMBER_URI_PREFIX):
                    lines.append(f"member:   node {uri[len(MEMBER_URI_PREFIX) :]} (cluster.node_id)")
                elif uri.startswith(SITE_URI_PREFIX):
                    lines.append(f"site:     {uri[len(SITE_URI_PREFIX) :]} (uplink.site_id)")
        lines.append("")
    return lines + crl if crl else lines[:-1]
