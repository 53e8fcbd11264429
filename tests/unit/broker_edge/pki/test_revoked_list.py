"""``DIR/revoked.json``, the list ``timestone pki revoke`` keeps, edited by hand (a serial copied from
``openssl x509 -serial``, a date typed in): ``revoke`` and ``crl`` read every entry, or refuse in one line
naming the file and the entry, writing nothing. Run as a process, on real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from broker_edge.pki.authority import Authority
from tests.unit.broker_edge.pki.test_other_tools_cas import files, pki, refusal


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    directory = tmp_path / "ca"
    assert pki("ca", str(directory)).returncode == 0
    assert pki("crl", "--ca", str(directory)).returncode == 0
    return directory


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        pytest.param({"serial": "zz"}, "serial 'zz' is not a serial number in hex", id="serial-not-hex"),
        pytest.param({"serial": "-1f"}, "serial '-1f' is not a serial number in hex", id="serial-negative"),
        pytest.param({"serial": "0"}, "serial '0' is not a serial number in hex", id="serial-zero"),
        pytest.param(
            {"serial": "1f", "revoked_at": "yesterday"},
            "revoked_at 'yesterday' is not a date and time (2026-11-30T10:00:00+00:00)",
            id="date-not-iso",
        ),
        pytest.param(
            {"serial": "1f", "revoked_at": 5},
            "revoked_at 5 is not a date and time (2026-11-30T10:00:00+00:00)",
            id="date-not-text",
        ),
    ],
)
def test_an_entry_that_does_not_read_is_refused_naming_it(
    tmp_path: Path, ca: Path, entry: dict[str, object], why: str
) -> None:
    """Such an entry stopped ``pki crl`` and ``pki revoke`` with a ValueError or TypeError traceback."""
    listing = ca / "revoked.json"
    listing.write_text(json.dumps([{"serial": "2a", "subject": "CN=d0"}, entry]))
    assert pki("issue", "client", "d1", "--ca", str(ca)).returncode == 0
    before = files(tmp_path)
    for argv in (["crl", "--ca", str(ca)], ["revoke", str(ca / "client-d1.pem"), "--ca", str(ca)]):
        assert refusal(pki(*argv)) == f"timestone pki {argv[0]}: {listing}: entry 2: {why}"
    assert files(tmp_path) == before


def test_a_serial_as_openssl_prints_it_is_read(ca: Path) -> None:
    """``openssl x509 -serial`` prints upper-case hex, which ``revoke`` took for another serial than its own
    lower-case one (the certificate listed twice); a date without a zone is taken as UTC."""
    assert pki("issue", "client", "d1", "--ca", str(ca)).returncode == 0
    serial = x509.load_pem_x509_certificate((ca / "client-d1.pem").read_bytes()).serial_number
    listed = [{"serial": f"{serial:X}", "revoked_at": "2026-11-30T10:00:00"}]
    (ca / "revoked.json").write_text(json.dumps(listed))
    done = pki("revoke", str(ca / "client-d1.pem"), "--ca", str(ca))
    assert done.returncode == 0 and " was revoked already; " in done.stdout, done
    assert json.loads((ca / "revoked.json").read_text()) == listed
    crl = x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())
    assert [entry.serial_number for entry in crl] == [serial]


def test_revocations_run_side_by_side_are_all_kept(ca: Path) -> None:
    """``ls stolen/*.pem | xargs -P12 -n1 timestone pki revoke --ca DIR``: each command read the list, added
    its certificate and wrote the list and the CRL again, so those run side by side wrote over each other's:
    each said 'revoked', exit 0, and 12 revocations left 3 to 8 in the CRL, the other keys still let in."""
    authority = Authority(ca)
    certificates = [authority.issue("client", f"d{n}", out=ca.parent / f"d{n}") for n in range(12)]
    command = [sys.executable, "-m", "pipelines.cli", "pki", "revoke", "--ca", str(ca)]
    running = [
        subprocess.Popen([*command, str(pair.cert)], stdout=subprocess.DEVNULL) for pair in certificates
    ]
    assert [process.wait(timeout=120) for process in running] == [0] * 12
    serials = {x509.load_pem_x509_certificate(pair.cert.read_bytes()).serial_number for pair in certificates}
    listed = {int(entry["serial"], 16) for entry in json.loads((ca / "revoked.json").read_text())}
    crl = x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())
    assert listed == serials and {entry.serial_number for entry in crl} == serials
