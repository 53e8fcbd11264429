"""A throwaway PKI for clusters, sites and hubs on loopback, over ``broker_edge.pki``.

For members on one host, benchmarks (the many-core kit makes its members' certificates with it) and tests;
a deployment issues its certificates with ``timestone pki`` (docs/security.md).

``LocalPki(directory, name)`` keeps one CA in ``directory/name`` (made on first use, reused after) and
issues from it what ``timestone pki issue`` issues, for loopback, each certificate once (later calls return
the files made first):

- ``member(node_id)``: a member's certificate (``timestone://node/<node_id>``), served on loopback;
- ``site(site_id)``: a site's uplink certificate (``timestone://site/<site_id>``);
- ``server(name)``: a certificate for ``127.0.0.1``, ``::1`` and ``localhost`` that serves and connects
  (an etcd: its JSON gateway connects to its own gRPC server with it), of kind ``etcd``;
- ``client(name)``: a client certificate whose subject CN is ``name`` (an etcd user); ``common_name=False``
  leaves the CN out (etcd's JSON gateway refuses a client certificate with a CN when it checks them).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509

from broker_edge.pki.authority import Authority, PemPair
from broker_edge.pki.builders import subject_name, write_certificate, write_key

__all__ = ["LOOPBACK_DNS", "LOOPBACK_IPS", "LOOPBACK_NAMES", "LocalPki", "PemPair"]

LOOPBACK_DNS = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")
LOOPBACK_NAMES: tuple[x509.GeneralName, ...] = (
    x509.DNSName("localhost"),
    *(x509.IPAddress(ipaddress.ip_address(address)) for address in LOOPBACK_IPS),
)


class LocalPki:
    """A CA in ``directory/name`` and the certificates it issues, kept in ``directory``."""

    def __init__(self, directory: str | Path, name: str = "ca") -> None:
        self.directory = Path(directory)
        ca_directory = self.directory / name
        self.authority = (
            Authority(ca_directory)
            if (ca_directory / "ca.key").exists()
            else Authority.create(ca_directory, f"Timestone local {name}")
        )
        self.ca = self.authority.ca

    def _once(self, kind: str, name: str, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> PemPair:
        pair = PemPair(self.directory / f"{kind}-{name}.pem", self.directory / f"{kind}-{name}.key")
        if pair.cert.exists():
            return pair
        return self.authority.issue(kind, name, dns=dns, ips=ips, out=self.directory / f"{kind}-{name}")

    def member(self, node_id: str) -> PemPair:
        return self._once("member", node_id, dns=LOOPBACK_DNS, ips=LOOPBACK_IPS)

    def site(self, site_id: str) -> PemPair:
        return self._once("site", site_id)

    def server(self, name: str) -> PemPair:
        return self._once("etcd", name, dns=LOOPBACK_DNS, ips=LOOPBACK_IPS)

    def client(self, name: str, common_name: bool = True) -> PemPair:
        if common_name:
            return self._once("client", name)
        pair = PemPair(
            self.directory / f"client-{name}-no-cn.pem", self.directory / f"client-{name}-no-cn.key"
        )
        if not pair.cert.exists():
            subject = subject_name(None, self.authority.organization)
            key, certificate = self.authority.sign(subject, server=False, client=True)
            write_key(pair.key, key)
            write_certificate(pair.cert, certificate)
        return pair
