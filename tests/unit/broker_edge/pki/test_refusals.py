"""``timestone pki`` refuses what would leave a broken PKI on disk: renewing a CA, renewing with a CA that did
not sign the certificate, writing over the CA's own files, and issuing from a CA that is not valid for as long
as the certificate would be. Each refusal is run through the command, on real files: its one line, its exit
status, and every file as it was."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pipelines.cli import main

DAY = datetime.timedelta(days=1)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` and its content."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``timestone pki`` says on standard error when it refuses (exit status 1)."""
    assert main(["pki", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def ca_valid(directory: Path, start: datetime.datetime, end: datetime.datetime) -> None:
    """A CA in ``directory`` valid from ``start`` until ``end``, made as ``timestone pki ca`` makes one."""
    directory.mkdir()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "plant"),
            x509.NameAttribute(NameOID.COMMON_NAME, "CA"),
        ]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "ca.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (directory / "ca.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def test_renewing_a_ca_is_refused_and_its_key_and_certificate_stay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = tmp_path / "ca"
    assert main(["pki", "ca", str(ca), "--name", "plant"]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)
    said = refused(["renew", str(ca / "ca.pem"), "--ca", str(ca)], capsys)
    assert said == (
        f"timestone pki renew: {ca / 'ca.pem'} is a CA: a CA is not renewed, it is replaced by a new one "
        "trusted beside it during the switch (docs/security.md, Certificates)"
    )
    assert snapshot(tmp_path) == before
    assert main(["pki", "issue", "server", "s", "--ca", str(ca), "--dns", "s.local"]) == 0


def test_nothing_is_written_over_the_cas_own_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = tmp_path / "ca"
    assert main(["pki", "ca", str(ca)]) == 0
    assert main(["pki", "issue", "server", "s", "--ca", str(ca), "--dns", "s.local"]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)
    said = refused(
        ["renew", str(ca / "server-s.pem"), "--key-file", str(ca / "ca.key"), "--ca", str(ca)], capsys
    )
    assert said.startswith(
        f"timestone pki renew: {ca / 'ca.key'} is the CA's own ca.key in {ca}: it is never"
    )
    for force in ([], ["--force"]):
        argv = ["issue", "server", "x", "--ca", str(ca), "--dns", "x", "--out", str(ca / "ca"), *force]
        assert refused(argv, capsys).startswith(
            f"timestone pki issue: {ca / 'ca.pem'} is the CA's own ca.pem"
        )
    assert snapshot(tmp_path) == before


def test_renew_refuses_a_key_file_that_is_not_the_certificates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = tmp_path / "ca"
    assert main(["pki", "ca", str(ca)]) == 0
    for name in ("a", "b"):
        assert main(["pki", "issue", "client", name, "--ca", str(ca), "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)
    said = refused(
        ["renew", str(tmp_path / "a.pem"), "--key-file", str(tmp_path / "b.key"), "--ca", str(ca)], capsys
    )
    assert said == (
        f"timestone pki renew: {tmp_path / 'b.key'} is not the key of {tmp_path / 'a.pem'}: give its key "
        "with --key-file"
    )
    assert snapshot(tmp_path) == before


def test_renew_with_another_ca_of_the_same_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "a" / "server-ca", tmp_path / "b" / "server-ca"
    assert main(["pki", "ca", str(first), "--name", "plant"]) == 0
    assert main(["pki", "ca", str(second), "--name", "plant"]) == 0
    gateway = tmp_path / "a" / "gw"
    assert (
        main(["pki", "issue", "server", "gw", "--ca", str(first), "--dns", "gw.local", "--out", str(gateway)])
        == 0
    )
    capsys.readouterr()
    before = snapshot(tmp_path)
    said = refused(["renew", f"{gateway}.pem", "--ca", str(second)], capsys)
    assert said == (
        f"timestone pki renew: {gateway}.pem was not issued by the CA in {second} (its signature is not that "
        "CA's): renew it with the CA that issued it"
    )
    assert snapshot(tmp_path) == before
    assert main(["pki", "renew", f"{gateway}.pem", "--ca", str(first)]) == 0
    renewed = x509.load_pem_x509_certificate(Path(f"{gateway}.pem").read_bytes())
    renewed.verify_directly_issued_by(x509.load_pem_x509_certificate((first / "ca.pem").read_bytes()))


@pytest.mark.parametrize(
    ("start", "end", "said"),
    [
        (
            -100 * DAY,
            -DAY,
            "has expired (valid from {start} until {end} UTC): no TLS peer accepts what it signs; ",
        ),
        (
            10 * DAY,
            100 * DAY,
            "is not valid yet (valid from {start} until {end} UTC): no TLS peer would accept",
        ),
        (
            -DAY,
            30 * DAY,
            "expires before a certificate of --days 365 would (valid from {start} until {end} UTC, ",
        ),
    ],
)
def test_a_ca_not_valid_for_as_long_as_the_certificate_issues_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    start: datetime.timedelta,
    end: datetime.timedelta,
    said: str,
) -> None:
    now = datetime.datetime.now(datetime.UTC).replace(second=0, microsecond=0)
    ca = tmp_path / "ca"
    ca_valid(ca, now + start, now + end)
    before = snapshot(tmp_path)
    line = refused(["issue", "server", "s", "--ca", str(ca), "--dns", "s.local"], capsys)
    dates = {"start": f"{now + start:%Y-%m-%d %H:%M}", "end": f"{now + end:%Y-%m-%d %H:%M}"}
    assert line.startswith(f"timestone pki issue: the CA in {ca} " + said.format(**dates))
    assert line.endswith("replace the CA by a new one trusted beside it (docs/security.md, Certificates)")
    assert snapshot(tmp_path) == before


def test_a_short_lived_ca_says_the_days_that_fit_and_issues_and_renews_within_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = tmp_path / "short"
    assert main(["pki", "ca", str(ca), "--days", "30"]) == 0
    capsys.readouterr()
    line = refused(["issue", "server", "s", "--ca", str(ca), "--dns", "s.local"], capsys)
    assert "UTC, 29 days left): give --days 29 or fewer, or replace the CA" in line
    assert not (ca / "server-s.pem").exists() and not (ca / "server-s.key").exists()
    assert main(["pki", "issue", "server", "s", "--ca", str(ca), "--dns", "s.local", "--days", "29"]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)
    assert "give --days 29 or fewer" in refused(["renew", str(ca / "server-s.pem"), "--ca", str(ca)], capsys)
    assert snapshot(tmp_path) == before
    assert main(["pki", "renew", str(ca / "server-s.pem"), "--ca", str(ca), "--days", "20"]) == 0
    leaf = x509.load_pem_x509_certificate((ca / "server-s.pem").read_bytes())
    authority = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    assert leaf.not_valid_after_utc <= authority.not_valid_after_utc


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["issue", "client", "a" * 65],
            f"NAME {'a' * 65!r}: from 1 to 64 characters in a certificate, got 65",
        ),
        (["issue", "server", "s", "--dns", "a/b"], "--dns 'a/b': not a host name"),
        (["issue", "server", "s", "--dns", "a..example"], "--dns 'a..example': not a host name"),
        (["issue", "server", "s", "--ip", "fe80::1%eth0"], "a zone (%...) is this host's"),
    ],
)
def test_names_no_certificate_holds_are_refused_in_one_line(tmp_path, capsys, argv, said):
    assert main(["pki", "ca", str(tmp_path / "ca")]) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert said in refused([*argv, "--ca", str(tmp_path / "ca")], capsys)
    assert snapshot(tmp_path) == before


def test_a_ca_name_too_long_for_its_cn_makes_no_directory(tmp_path, capsys):
    assert "from 1 to 64 characters" in refused(["ca", str(tmp_path / "ca"), "--name", "p" * 62], capsys)
    assert not (tmp_path / "ca").exists()


def test_an_internationalized_host_name_is_named_by_its_a_label(tmp_path, capsys):
    assert main(["pki", "ca", str(tmp_path / "ca")]) == 0
    argv = ["pki", "issue", "server", "s", "--ca", str(tmp_path / "ca"), "--dns", "bücher.example"]
    assert main(argv) == 0
    issued = x509.load_pem_x509_certificate((tmp_path / "ca" / "server-s.pem").read_bytes())
    names = issued.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["xn--bcher-kva.example"]


@pytest.mark.parametrize("existing", [0o1777, 0o700, 0o750])
def test_a_ca_made_in_a_directory_that_exists_leaves_its_mode_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], existing: int
) -> None:
    """``timestone pki ca`` in a directory the operator made (a shared 1777 one like /tmp, a private 0700
    one): its mode stays, where it was set to 0711 (/tmp lost its sticky bit and its write for everyone, a
    private directory was opened for others to pass through); one the command makes is 0711."""
    shared = tmp_path / "existing"
    shared.mkdir()
    shared.chmod(existing)
    assert main(["pki", "ca", str(shared), "--name", "plant"]) == 0
    assert (shared / "ca.key").stat().st_mode & 0o7777 == 0o600
    assert shared.stat().st_mode & 0o7777 == existing
    assert main(["pki", "ca", str(tmp_path / "made" / "ca")]) == 0
    assert (tmp_path / "made" / "ca").stat().st_mode & 0o7777 == 0o711
    capsys.readouterr()


def test_a_cas_certificate_file_given_for_its_directory_is_said_so(tmp_path, capsys):
    """``--ca DIR/ca.pem`` (a listener's cafile names that file) said ``[Errno 20] Not a directory:
    'DIR/ca.pem/ca.key'``, and ``pki ca DIR/ca.pem`` ``[Errno 17] File exists``."""
    ca = tmp_path / "ca"
    assert main(["pki", "ca", str(ca)]) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    pem = ca / "ca.pem"
    assert refused(["issue", "client", "d1", "--ca", str(pem)], capsys) == (
        f"timestone pki issue: --ca {pem} is a file: --ca names the CA's directory ({ca})"
    )
    assert refused(["ca", str(pem)], capsys) == (
        f"timestone pki ca: {pem} is a file: timestone pki ca makes the CA's directory"
    )
    assert snapshot(tmp_path) == before
