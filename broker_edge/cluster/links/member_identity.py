"""Who a member is: the node id its certificate names, proven on every connection between members.

Members authenticate each other with mutual TLS under the cluster's CA (``cluster.tls``), as Kafka's
inter-broker TLS, etcd's peer TLS and EMQX's cluster TLS do. A member's certificate names its node id as
one URI subject alternative name, ``timestone://node/<node_id>`` (``member_uri``): not a host name, since
a member is known by its node id wherever it runs, and not the subject CN, which other tools read as a
host or user name. Both directions check it:

- **Inbound** (``member_api``): the members' endpoint requires a client certificate from the cluster CA;
  the node id it names must be a current member, and the node id a request claims (the peer link's
  ``X-Timestone-Node``, a replica fetch's replica) must be that one: a member acts only as itself.
- **Outbound** (``member_clients``): a broker connects to the address etcd gives for a node and, before
  it sends anything, checks that the certificate there names that node. A member key written into etcd
  by someone without a member certificate gets nothing: the handshake (or the check right after it)
  fails first.

Host names are not checked (``check_hostname`` off): the certificate's node id is the identity, and the
cluster CA issues certificates to members only. A broker refuses to start with a certificate that does not
name its own node id. ``reload`` (SIGHUP) reads the certificate, key and CAs again: connections already
open keep theirs, new ones use the new files (a CA file holding the old and the new CA accepts both while
a CA is rotated).
"""

from __future__ import annotations

import datetime
import logging
import ssl
from pathlib import Path
from typing import Any

from broker_edge.config.loader import ConfigError
from broker_edge.security.client_trust import ClientTrust
from broker_edge.security.tls import ServerContexts, certificate_uris, load_key_pair
from broker_edge.settings.cluster import NODE_ID, MemberTlsConfig

__all__ = ["MEMBER_URI_PREFIX", "MemberTls", "member_uri", "node_of_certificate", "node_of_certificate_file"]

log = logging.getLogger("broker_edge.cluster.member_identity")

MEMBER_URI_PREFIX = "timestone://node/"
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def member_uri(node_id: str) -> str:
    """The URI subject alternative name a member's certificate carries."""
    return f"{MEMBER_URI_PREFIX}{node_id}"


def _node_of_uris(uris: list[str]) -> str | None:
    named = [uri[len(MEMBER_URI_PREFIX) :] for uri in uris if uri.startswith(MEMBER_URI_PREFIX)]
    if len(named) != 1 or not NODE_ID.match(named[0]):
        return None  # none, or several: a certificate names one member
    return named[0]


def node_of_certificate(peercert: dict[str, Any] | None) -> str | None:
    """The node id a verified peer certificate names (``SSLObject.getpeercert()``), or None."""
    if not peercert:
        return None
    uris = [str(value) for kind, value in peercert.get("subjectAltName", ()) if kind == "URI"]
    return _node_of_uris(uris)


def node_of_certificate_file(path: str) -> tuple[str | None, datetime.datetime]:
    """The node id the first certificate of a PEM file names (or None), and when it expires."""
    uris, expires = certificate_uris(path)
    return _node_of_uris(uris), expires


class MemberTls:
    """This member's TLS: the server side of its members' endpoint and the client side it connects to
    other members with, both from ``config``; ``reload`` re-reads the files."""

    def __init__(self, config: MemberTlsConfig, node_id: str) -> None:
        self.config = config
        self.node_id = node_id
        self.expires: datetime.datetime | None = None
        self._client = self._client_context()
        self.server = ServerContexts(self._server_context, trust=ClientTrust(config.cafile))
        """The members' endpoint's TLS, and the cluster CAs of its last reload (no CRLs)."""

    @property
    def client_context(self) -> ssl.SSLContext:
        """The context new connections to members use (the newest files)."""
        return self._client

    def reload(self) -> None:
        """Read the certificate, key and CAs again; ``ConfigError`` (the files in force stay) when they
        do not load or the certificate does not name this node."""
        client = self._client_context()
        self.server.reload()
        self._client = client
        log.info("member certificate and cluster CAs reloaded (certificate valid until %s)", self.expires)

    def _check_files(self) -> None:
        config = self.config
        for name in ("certfile", "keyfile", "cafile"):
            if not Path(getattr(config, name)).is_file():
                raise ConfigError(f"cluster.tls.{name}", f"file not found: {getattr(config, name)}")
        try:
            named, expires = node_of_certificate_file(config.certfile)
        except ValueError as error:
            raise ConfigError("cluster.tls.certfile", f"not a PEM certificate: {error}") from None
        if named != self.node_id:
            raise ConfigError(
                "cluster.tls.certfile",
                f"must name this node as its one URI subject alternative name {member_uri(self.node_id)!r}, "
                f"names {named!r}",
            )
        self.expires = expires
        if expires <= datetime.datetime.now(datetime.UTC):
            log.error("the member certificate %s expired at %s", config.certfile, expires)

    def _load(self, context: ssl.SSLContext) -> ssl.SSLContext:
        config = self.config
        context.minimum_version = _VERSIONS[config.min_version]
        context.options |= ssl.OP_NO_COMPRESSION
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            load_key_pair(context, config.certfile, config.keyfile, "cluster.tls.keyfile")
        except ssl.SSLError as error:
            raise ConfigError("cluster.tls.certfile", f"cannot load certificate and key: {error}") from None
        try:
            context.load_verify_locations(cafile=config.cafile)
        except ssl.SSLError as error:
            raise ConfigError("cluster.tls.cafile", f"cannot load CA certificates: {error}") from None
        return context

    def _server_context(self) -> ssl.SSLContext:
        self._check_files()
        return self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))

    def _client_context(self) -> ssl.SSLContext:
        self._check_files()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False  # the identity is the node id the certificate names, checked after
        return self._load(context)
