"""A listener's ``crlfile`` against its ``cafile``: every CA of ``timestone pki`` (which signs end
certificates only) needs an unexpired CRL there, or OpenSSL refuses every certificate it issued."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from broker_edge.config import ConfigError
from broker_edge.pki.authority import Authority
from broker_edge.pki.revocation import write_crl
from broker_edge.security.tls import TlsConfig, check_crls_cover, server_ssl_context


def test_an_expired_crl_of_a_ca_in_the_cafile_is_refused_naming_it(tmp_path: Path) -> None:
    authority = Authority.create(tmp_path / "ca", "devices")
    server = authority.issue("server", "broker", dns=["localhost"])
    crl = write_crl(authority)
    config = TlsConfig(str(server.cert), str(server.key), str(authority.ca.cert), True, crlfile=str(crl))
    server_ssl_context(config)  # a CRL of its own CA, valid as long as the CA
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=4000)
    with pytest.raises(
        ConfigError, match=r"crlfile: the CRL of the CA CN=devices CA,O=devices in .* has expired"
    ):
        check_crls_cover(str(authority.ca.cert), str(crl), later)
