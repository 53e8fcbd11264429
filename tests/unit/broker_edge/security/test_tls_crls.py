"""A listener's ``crlfile`` against its ``cafile``: every CA of ``timestone pki`` (which signs end
certificates only) needs an unexpired CRL there, or OpenSSL refuses every certificate it issued."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from broker_edge.pki.authority import Authority
from broker_edge.pki.revocation import write_crl
from broker_edge.security.tls import TlsConfig, files_not_valid_now, server_ssl_context


def test_an_expired_crl_of_a_ca_in_the_cafile_is_said_naming_it(tmp_path: Path) -> None:
    """What ``broker --check`` and a reload refuse and a start says at ERROR: the CRL of a CA whose
    certificates the listener checks, expired (then every certificate of that CA is refused)."""
    authority = Authority.create(tmp_path / "ca", "devices")
    server = authority.issue("server", "broker", dns=["localhost"])
    crl = write_crl(authority)
    config = TlsConfig(str(server.cert), str(server.key), str(authority.ca.cert), True, crlfile=str(crl))
    server_ssl_context(config)  # a CRL of its own CA, valid as long as the CA
    assert files_not_valid_now(config) is None
    now = datetime.datetime.now(datetime.UTC)
    assert (files_not_valid_now(config, now + datetime.timedelta(days=4000)) or ("",))[0] == "certfile"
    builder = x509.CertificateRevocationListBuilder().issuer_name(authority.certificate.subject)
    short = builder.last_update(now).next_update(now + datetime.timedelta(days=1))  # another PKI's CRL
    crl.write_bytes(authority.sign_crl(short).public_bytes(serialization.Encoding.PEM))
    key, problem = files_not_valid_now(config, now + datetime.timedelta(days=2)) or ("", "")
    assert key == "crlfile"
    assert problem.startswith(f"the CRL of the CA CN=devices CA,O=devices in {crl} has expired")
