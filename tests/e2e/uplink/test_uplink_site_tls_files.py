"""A site's TLS files that do not load (a CA file that is no PEM, a key of another certificate) are named by
their dotted key: at start (``timestone broker`` exits 2 before it opens its store), and at a dial after
the files were replaced while it ran (one line, no traceback), where the site said only OpenSSL's words,
"no certificate or crl found" or "key values mismatch", at every dial, naming no setting."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from broker_edge.runtime.launcher import free_port
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import pki_in, site_section

pytestmark = pytest.mark.timeout(60)


def site_refused(tmp_path: Path, tls: dict[str, str]) -> str:
    """``timestone broker`` on a site config with ``tls``: exit 2, no store opened; its stderr."""
    uplink = {"hubs": ["wss://127.0.0.1:1/v1/uplink"], "site_id": "plant-t", "tls": tls}
    config = tmp_path / "broker.yaml"
    config.write_text(
        yaml.safe_dump({"uplink": uplink, "admin_http": {"port": 0}, "offsets_api": {"port": 0}})
    )
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "timestone-data").exists()
    return done.stderr


def test_a_site_ca_file_that_is_no_pem_and_a_key_of_another_certificate_are_refused_at_start(
    tmp_path: Path,
) -> None:
    pki = pki_in(tmp_path / "pki")
    site, other = pki.site("plant-t"), pki.site("plant-u")
    not_pem = tmp_path / "ca.der"
    not_pem.write_bytes(b"\x30\x82\x01\x0a not a certificate")
    files = {"certfile": str(site.cert), "keyfile": str(site.key), "cafile": str(pki.ca.cert)}

    err = site_refused(tmp_path, {**files, "cafile": str(not_pem)})
    assert f"configuration error: uplink.tls.cafile: cannot load CA certificates from {not_pem}" in err
    err = site_refused(tmp_path, {**files, "keyfile": str(other.key)})
    assert "configuration error: uplink.tls.certfile: cannot load certificate and key" in err
    assert str(site.cert) in err and str(other.key) in err


def test_a_site_ca_file_replaced_by_one_that_does_not_load_is_named_at_each_dial(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = pki_in(tmp_path / "pki")
    ca_copy = tmp_path / "hub-ca.pem"
    ca_copy.write_bytes(pki.ca.cert.read_bytes())
    section = site_section(pki, "plant-t", free_port())  # no hub there: the site keeps dialling
    section["tls"]["cafile"] = str(ca_copy)
    brokers("site", uplink=section)
    ca_copy.write_text("not a PEM file\n")

    def named() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "uplink.tls.cafile" in r.getMessage()]

    assert wait_for(lambda: bool(named()), timeout=10)
    record = named()[0]
    assert record.exc_info is None
    assert f"cannot load CA certificates from {ca_copy}" in record.getMessage()


def test_a_site_certificate_replaced_by_one_naming_another_site_is_refused_at_each_dial(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The files are read again at each dial (a rotation is taken without a restart): a certificate and key
    replaced by another site's of the same CA would have been taken, the hub filing this site's logs under
    the other one's."""
    pki = pki_in(tmp_path / "pki")
    other = pki.site("plant-u")
    section = site_section(pki, "plant-t", free_port())  # no hub there: the site keeps dialling
    cert, key = tmp_path / "site.pem", tmp_path / "site.key"
    cert.write_bytes(Path(section["tls"]["certfile"]).read_bytes())
    key.write_bytes(Path(section["tls"]["keyfile"]).read_bytes())
    section["tls"].update(certfile=str(cert), keyfile=str(key))
    brokers("site", uplink=section)
    key.write_bytes(other.key.read_bytes())
    cert.write_bytes(other.cert.read_bytes())

    def named() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "uplink.tls.certfile" in r.getMessage()]

    assert wait_for(lambda: bool(named()), timeout=10)
    record = named()[0]
    assert record.exc_info is None and record.levelno == logging.ERROR
    assert (
        "must name this site as its one URI subject alternative name 'timestone://site/plant-t' "
        "(uplink.site_id), names 'plant-u'" in record.getMessage()
    )


def test_a_site_certificate_naming_another_site_is_refused_by_check_and_start(tmp_path: Path) -> None:
    """The hub files a site's logs under the site its certificate names: a site whose certificate names
    another one than ``uplink.site_id`` would send them where its own status does not say."""
    pki = pki_in(tmp_path / "pki")
    other = pki.site("plant-u")
    tls = {"certfile": str(other.cert), "keyfile": str(other.key), "cafile": str(pki.ca.cert)}
    uplink = {"hubs": ["wss://127.0.0.1:1/v1/uplink"], "site_id": "plant-t", "tls": tls}
    config = tmp_path / "broker.yaml"
    config.write_text(
        yaml.safe_dump({"uplink": uplink, "admin_http": {"port": 0}, "offsets_api": {"port": 0}})
    )
    expected = (
        "configuration error: uplink.tls.certfile: must name this site as its one URI subject alternative "
        "name 'timestone://site/plant-t' (uplink.site_id), names 'plant-u'"
    )
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert expected in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert expected in site_refused(tmp_path, tls)  # site_id plant-t: no data directory made
