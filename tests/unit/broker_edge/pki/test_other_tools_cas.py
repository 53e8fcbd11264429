"""``timestone pki`` over a CA another tool made (openssl, another PKI) and copied into a directory as
``ca.pem`` and ``ca.key``: its files in the formats those tools write (a traditional ``EC PRIVATE KEY``, a
chain file), and mistakes made copying them. Each case runs the command as a process, on real files: its
exit status, its one line, and every file as it was when it refuses."""

from __future__ import annotations

import datetime
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from broker_edge.pki.builders import LeafKey
from tests.unit.broker_edge.pki.test_authority import handshake

DAY = datetime.timedelta(days=1)


def pki(*argv: str) -> subprocess.CompletedProcess[str]:
    """``timestone pki ARGV...`` run as a process."""
    command = [sys.executable, "-m", "pipelines.cli", "pki", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a refusal (exit status 1) says on standard error, with nothing on standard output."""
    assert (done.returncode, done.stdout) == (1, ""), done
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def files(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` and its content."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


def ca_certificate(
    name: str,
    key: LeafKey,
    *extensions: x509.ExtensionType,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
) -> x509.Certificate:
    """A CA certificate named ``name`` for ``key`` with ``extensions`` (critical), self-signed unless
    ``issuer`` (its certificate and key) signs it; valid for two years."""
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme"), x509.NameAttribute(NameOID.COMMON_NAME, name)]
    )
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - DAY)
        .not_valid_after(now + 730 * DAY)
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=True)
    signer = issuer[1] if issuer else key
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    return builder.sign(signer, hashes.SHA256())


def pem(*certificates: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def openssl_key(key: LeafKey) -> bytes:
    """``key`` as ``openssl ecparam -genkey`` or ``genrsa`` writes it (``BEGIN EC PRIVATE KEY``), an Ed25519
    one as ``openssl genpkey`` does (PKCS#8)."""
    traditional = isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL if traditional else serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


CA_EXTENSION = x509.BasicConstraints(ca=True, path_length=None)


def test_a_ca_key_that_is_not_the_ca_certificates_is_refused_naming_it(tmp_path: Path) -> None:
    """A ``ca.key`` copied from another CA beside a ``ca.pem`` (two CAs' files mixed up) issued, exit 0,
    certificates signed by a key no ``cafile`` trusts: every TLS peer refused them ("unable to get local
    issuer certificate")."""
    ca = tmp_path / "ca"
    ca.mkdir()
    ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    (ca / "ca.pem").write_bytes(pem(ca_certificate("Acme Root", ca_key, CA_EXTENSION)))
    (ca / "ca.key").write_bytes(openssl_key(other_key))
    before = files(tmp_path)
    for argv in (
        ["issue", "client", "d1", "--ca", str(ca)],
        ["crl", "--ca", str(ca)],
    ):
        assert refusal(pki(*argv)) == (
            f"timestone pki {argv[0]}: {ca / 'ca.key'} is not the key of {ca / 'ca.pem'}: put the CA's own "
            "key there"
        )
    assert files(tmp_path) == before
    (ca / "ca.key").write_bytes(openssl_key(ca_key))
    assert pki("issue", "client", "d1", "--ca", str(ca)).returncode == 0
    issued = x509.load_pem_x509_certificate((ca / "client-d1.pem").read_bytes())
    issued.verify_directly_issued_by(x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes()))


def key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    """A CA's key usage, with or without ``keyCertSign``."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


@pytest.mark.parametrize(
    ("extensions", "why"),
    [
        pytest.param((), "no basicConstraints CA:TRUE", id="no-basic-constraints"),
        pytest.param(
            (x509.BasicConstraints(ca=False, path_length=None),), "basicConstraints CA:FALSE", id="ca-false"
        ),
        pytest.param(
            (CA_EXTENSION, key_usage(cert_sign=False)), "its key usage has no keyCertSign", id="no-cert-sign"
        ),
    ],
)
def test_a_certificate_that_may_not_sign_certificates_is_no_ca(
    tmp_path: Path, extensions: tuple[x509.ExtensionType, ...], why: str
) -> None:
    """``openssl req -x509`` with a configuration of no ``v3_ca`` section (no basicConstraints), a server's
    certificate copied as ``ca.pem``, or a key usage without keyCertSign: ``issue`` wrote certificates, exit
    0, that every TLS peer refused ("invalid CA certificate")."""
    ca = tmp_path / "ca"
    ca.mkdir()
    key = ec.generate_private_key(ec.SECP256R1())
    (ca / "ca.pem").write_bytes(pem(ca_certificate("Acme Root", key, *extensions)))
    (ca / "ca.key").write_bytes(openssl_key(key))
    before = files(tmp_path)
    assert refusal(pki("issue", "server", "s", "--ca", str(ca), "--dns", "localhost")) == (
        f"timestone pki issue: {ca / 'ca.pem'} is not a CA's certificate ({why}): TLS peers refuse what it "
        "signs (invalid CA certificate)"
    )
    assert files(tmp_path) == before


def test_a_ca_of_an_intermediate_writes_it_after_every_certificate_it_signs(tmp_path: Path) -> None:
    """``ca.pem`` holding an intermediate then its root (how another PKI hands an intermediate CA over) issued
    and renewed certificate files of the certificate alone: a server serving one, or a device sending one,
    was refused by every peer whose ``cafile`` holds the root ("unable to get local issuer certificate").
    Each file now holds the certificate then the intermediate, as docs/security.md says ``certfile`` does."""
    root_key = ec.generate_private_key(ec.SECP256R1())
    intermediate_key = ec.generate_private_key(ec.SECP256R1())
    root = ca_certificate("Acme Root", root_key, CA_EXTENSION)
    signs_end_certificates = x509.BasicConstraints(ca=True, path_length=0)
    intermediate = ca_certificate(
        "Acme Devices", intermediate_key, signs_end_certificates, issuer=(root, root_key)
    )
    ca = tmp_path / "ca"
    ca.mkdir()
    (ca / "ca.pem").write_bytes(pem(intermediate, root))
    (ca / "ca.key").write_bytes(openssl_key(intermediate_key))
    (tmp_path / "root.pem").write_bytes(pem(root))
    trusting_the_root = ssl.create_default_context(cafile=str(tmp_path / "root.pem"))
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    for argv in (
        ["issue", "server", "s", "--ca", str(ca), "--dns", "localhost", "--out", str(cert)],
        ["renew", str(cert), "--ca", str(ca)],
    ):
        assert pki(*argv).returncode == 0
        assert x509.load_pem_x509_certificates(cert.read_bytes())[1:] == [intermediate]
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(cert, key)
        _, served = handshake(server, trusting_the_root, "localhost")
        assert served["subject"] == ((("organizationName", "Acme"),), (("commonName", "s"),))


def encrypted_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """``key`` as ``openssl genpkey -aes256`` writes it (``BEGIN ENCRYPTED PRIVATE KEY``, PKCS#8)."""
    encryption = serialization.BestAvailableEncryption(b"passphrase")
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


@pytest.mark.parametrize(
    ("pem_of", "key_of", "said"),
    [
        pytest.param(
            "certificate",
            "encrypted",
            "{ca}/ca.key: an encrypted key (a passphrase): timestone pki reads an unencrypted one "
            "(openssl pkey -in ENCRYPTED -out {ca}/ca.key), kept 0600",
            id="encrypted-pkcs8-key",
        ),
        pytest.param(
            "certificate", "certificate", "{ca}/ca.key: a certificate, not a private key", id="pem-as-key"
        ),
        pytest.param("certificate", "empty", "{ca}/ca.key: no PEM private key", id="empty-key"),
        pytest.param("key", "key", "{ca}/ca.pem: a private key, not a certificate", id="key-as-pem"),
        pytest.param(
            "certificate",
            None,
            "{ca}/ca.key: no such file (a CA's directory holds its certificate, ca.pem, and its key, ca.key)",
            id="no-key",
        ),
    ],
)
def test_a_ca_file_that_does_not_load_is_named_with_what_it_holds(
    tmp_path: Path, pem_of: str, key_of: str | None, said: str
) -> None:
    """Such files said 'the CA in DIR does not load: Unable to load PEM file. See https://cryptography.io/...
    MalformedFraming' or 'Password was not given but private key is encrypted', naming neither file; a
    missing ca.key beside its ca.pem said 'no CA in DIR: make one with timestone pki ca DIR', which then
    refuses, the directory holding a CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    contents = {
        "certificate": pem(ca_certificate("Acme Root", key, CA_EXTENSION)),
        "key": openssl_key(key),
        "encrypted": encrypted_key(key),
        "empty": b"",
    }
    ca = tmp_path / "ca"
    ca.mkdir()
    (ca / "ca.pem").write_bytes(contents[pem_of])
    if key_of is not None:
        (ca / "ca.key").write_bytes(contents[key_of])
    before = files(tmp_path)
    for argv in (["issue", "client", "d1", "--ca", str(ca)], ["revoke", str(ca / "ca.pem"), "--ca", str(ca)]):
        assert refusal(pki(*argv)) == f"timestone pki {argv[0]}: " + said.format(ca=ca)
    assert files(tmp_path) == before


def made_by_another_tool(
    ca: Path, *extensions: x509.ExtensionType, key: LeafKey | None = None
) -> tuple[Path, Path]:
    """A certificate for ``localhost`` that the CA in ``ca`` signed outside ``timestone pki`` (``openssl x509
    -req -CA``), with ``extensions``, for ``key`` (EC P-256 by default): its files, ``legacy.pem`` and
    ``legacy.key`` beside the CA."""
    ca_certificate_ = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = key or ec.generate_private_key(ec.SECP256R1())
    certificate = ca_certificate("legacy", key, *extensions, issuer=(ca_certificate_, ca_key))
    cert, key_path = ca.parent / "legacy.pem", ca.parent / "legacy.key"
    cert.write_bytes(pem(certificate))
    key_path.write_bytes(openssl_key(key))
    return cert, key_path


@pytest.mark.parametrize(
    "make_key",
    [
        lambda: ec.generate_private_key(ec.SECP384R1()),
        lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ed25519.Ed25519PrivateKey.generate,
    ],
    ids=["ec-p384", "rsa-2048", "ed25519"],
)
def test_renew_keeps_the_kind_of_key_another_tool_made(
    tmp_path: Path, make_key: Callable[[], LeafKey]
) -> None:
    """A P-384 key was renewed as P-256, an RSA 2048 or an Ed25519 one as RSA 3072, in silence: the new key
    is of the old one's kind (its curve, its size), and is the key of the new certificate."""
    ca = tmp_path / "ca"
    assert pki("ca", str(ca)).returncode == 0
    old_key = make_key()
    cert, key = made_by_another_tool(ca, x509.BasicConstraints(ca=False, path_length=None), key=old_key)
    done = pki("renew", str(cert), "--ca", str(ca))
    assert (done.returncode, done.stderr) == (0, ""), done
    new_key = serialization.load_pem_private_key(key.read_bytes(), None)
    new_public = x509.load_pem_x509_certificate(cert.read_bytes()).public_key()
    assert new_key.public_key() == new_public != old_key.public_key()
    assert key_kind(new_public) == key_kind(old_key.public_key())


def key_kind(public_key: object) -> tuple[str, object]:
    """What a key is: its class, and its curve or size where it has one."""
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        return "ec", public_key.curve.name
    if isinstance(public_key, rsa.RSAPublicKey):
        return "rsa", public_key.key_size
    return type(public_key).__name__, None


def test_a_certificate_of_no_extended_key_usage_is_renewed_for_any_use_as_it_was(tmp_path: Path) -> None:
    """Such a certificate (any use) was renewed with an empty extendedKeyUsage, which every TLS peer refuses
    for any use ('unsuitable certificate purpose'): its working files were replaced, then the command
    stopped with a ValueError traceback."""
    ca = tmp_path / "ca"
    assert pki("ca", str(ca)).returncode == 0
    names = x509.SubjectAlternativeName([x509.DNSName("localhost")])
    cert, key = made_by_another_tool(ca, x509.BasicConstraints(ca=False, path_length=None), names)
    done = pki("renew", str(cert), "--ca", str(ca))
    assert (done.returncode, done.stderr) == (0, ""), done
    renewed = x509.load_pem_x509_certificate(cert.read_bytes())
    assert renewed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value == names
    with pytest.raises(x509.ExtensionNotFound):
        renewed.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    _, served = handshake(server, ssl.create_default_context(cafile=str(ca / "ca.pem")), "localhost")
    assert served["subject"] == ((("organizationName", "Acme"),), (("commonName", "legacy"),))


def test_a_certificate_whose_extensions_do_not_parse_is_said_so_in_one_line(tmp_path: Path) -> None:
    """An empty extendedKeyUsage (what renew wrote of a certificate of none) is no valid DER: ``show`` and
    ``renew`` of it stopped with a ValueError traceback."""
    ca = tmp_path / "ca"
    assert pki("ca", str(ca)).returncode == 0
    cert, _ = made_by_another_tool(ca, x509.ExtendedKeyUsage([]))
    before = files(tmp_path)
    for argv in (["show", str(cert)], ["renew", str(cert), "--ca", str(ca)]):
        assert refusal(pki(*argv)).startswith(
            f"timestone pki {argv[0]}: {cert}: its extensions do not parse (error parsing asn1 value: "
        )
    assert files(tmp_path) == before


def test_cas_made_side_by_side_in_one_directory_leave_one_never_overwritten(tmp_path: Path) -> None:
    """A provisioning script run twice at once (``timestone pki ca DIR`` in each): both found no CA, and the
    later one's files replaced the CA the earlier one had written and said it wrote, exit 0 for both. One
    CA is made; every other command says the directory already holds one, exit 1."""
    command = [sys.executable, "-m", "pipelines.cli", "pki", "ca"]
    for round_ in range(4):
        ca = tmp_path / f"ca{round_}"
        running = [
            subprocess.Popen(
                [*command, str(ca)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
            for _ in range(12)
        ]
        errors = [process.communicate(timeout=120)[1] for process in running]
        assert sorted(process.returncode for process in running) == [0] + [1] * 11
        said = f"timestone pki ca: {ca} already holds a CA (ca.pem, ca.key): it is never replaced in place\n"
        assert sorted(errors) == [""] + [said] * 11
        certificate = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((ca / "ca.key").read_bytes(), None)
        spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        assert key.public_key().public_bytes(*spki) == certificate.public_key().public_bytes(*spki)
