"""``timestone pki show`` of files other tools write: a CRL after ``openssl crl -text``'s text or a byte
order mark, a CA and its CRL in one file, and DER files. Run as a process, on real files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from tests.unit.broker_edge.pki.test_other_tools_cas import pki, refusal


@pytest.fixture
def revoked(tmp_path: Path) -> Path:
    """A CA (``plant``) that revoked one certificate: its directory."""
    ca = tmp_path / "ca"
    for argv in (
        ["ca", str(ca), "--name", "plant"],
        ["issue", "client", "d1", "--ca", str(ca)],
        ["revoke", str(ca / "client-d1.pem"), "--ca", str(ca)],
    ):
        assert pki(*argv).returncode == 0
    return ca


def shown(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert (done.returncode, done.stderr) == (0, ""), done
    return done.stdout.splitlines()


def test_a_crl_after_text_or_a_byte_order_mark_is_shown(tmp_path: Path, revoked: Path) -> None:
    """``openssl crl -text`` writes its text before the PEM, Notepad a byte order mark: ``show`` said 'a CRL,
    not a certificate', exit 1, of a file every listener reads as its crlfile."""
    crl = (revoked / "crl.pem").read_bytes()
    said = shown(pki("show", str(revoked / "crl.pem")))
    assert said[1] == "  CRL of:   CN=plant CA,O=plant"
    for name, data in (
        ("text.pem", b"Certificate Revocation List (CRL):\n    Version 2 (0x1)\n" + crl),
        ("bom.pem", b"\xef\xbb\xbf" + crl),
    ):
        (tmp_path / name).write_bytes(data)
        assert shown(pki("show", str(tmp_path / name)))[1:] == said[1:]


def test_a_ca_and_its_crl_in_one_file_are_both_shown(tmp_path: Path, revoked: Path) -> None:
    """A file holding the CA then its CRL (one file for both, as OpenSSL's load_verify_locations reads it)
    showed the CA alone, saying nothing of the CRL."""
    both = tmp_path / "both.pem"
    both.write_bytes((revoked / "ca.pem").read_bytes() + (revoked / "crl.pem").read_bytes())
    said = shown(pki("show", str(both)))
    assert said[1] == "  subject:  CN=plant CA,O=plant"
    assert "  CRL of:   CN=plant CA,O=plant" in said


def test_a_der_file_is_said_to_be_der_with_the_command_that_makes_it_pem(
    tmp_path: Path, revoked: Path
) -> None:
    """A certificate or CRL in DER (``openssl x509 -outform der``, a ``.cer`` from Windows) was 'no PEM
    certificate', which did not say what it is nor how to make the PEM file every setting reads."""
    certificate = x509.load_pem_x509_certificate((revoked / "client-d1.pem").read_bytes())
    crl = x509.load_pem_x509_crl((revoked / "crl.pem").read_bytes())
    for name, data, what, command in (
        ("d1.cer", certificate.public_bytes(Encoding.DER), "a certificate", "x509"),
        ("crl.der", crl.public_bytes(Encoding.DER), "a CRL", "crl"),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        assert refusal(pki("show", str(path))) == (
            f"timestone pki show: {path}: {what} in DER, not PEM: openssl {command} -inform der -in {path} "
            f"-out {path.with_suffix('.pem')}"
        )
