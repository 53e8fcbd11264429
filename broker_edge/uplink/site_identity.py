"""Who a site is: the site id its certificate names, the hub's only proof of which namespace a site writes.

As a cluster member is named by ``timestone://node/<node_id>`` (``cluster.links.member_identity``), a site's
certificate carries one URI subject alternative name ``timestone://site/<site_id>``, issued by the CA the
hub trusts for sites (``uplink_hub.tls.cafile``). The subject CN is not used: other tools read it as a host
or user name.
"""

from __future__ import annotations

from typing import Any

from broker_edge.config.loader import ConfigError
from broker_edge.settings.uplink import SITE_ID

__all__ = [
    "SITE_URI_PREFIX",
    "check_site_certificate",
    "site_of_certificate",
    "site_of_certificate_file",
    "site_uri",
]

SITE_URI_PREFIX = "timestone://site/"


def site_uri(site_id: str) -> str:
    """The URI subject alternative name a site's certificate carries."""
    return f"{SITE_URI_PREFIX}{site_id}"


def site_of_certificate(peercert: dict[str, Any] | None) -> str | None:
    """The site id a verified peer certificate names (``SSLObject.getpeercert()``), or None (none, or
    several: a certificate names one site)."""
    if not peercert:
        return None
    return _site_of_uris([str(value) for kind, value in peercert.get("subjectAltName", ()) if kind == "URI"])


def site_of_certificate_file(path: str) -> str | None:
    """The site id the first certificate of a PEM file names, read as ``site_of_certificate`` reads a
    peer's (None: none, or several); ``ValueError`` when the file holds no PEM certificate."""
    from broker_edge.security.tls import certificate_uris

    return _site_of_uris(certificate_uris(path)[0])


def check_site_certificate(certfile: str, site_id: str) -> None:
    """``ConfigError`` naming ``uplink.tls.certfile`` unless the certificate in ``certfile`` names ``site_id``
    (the hub would file the site's logs under the site it names): a start's and ``--check``'s check, and
    each dial's, since the files are read again at each one."""
    try:
        named = site_of_certificate_file(certfile)
    except ValueError as error:
        raise ConfigError("uplink.tls.certfile", f"not a PEM certificate: {error}") from None
    if named != site_id:
        raise ConfigError(
            "uplink.tls.certfile",
            f"must name this site as its one URI subject alternative name {site_uri(site_id)!r} "
            f"(uplink.site_id), names {named!r}",
        )


def _site_of_uris(uris: list[str]) -> str | None:
    named = [uri[len(SITE_URI_PREFIX) :] for uri in uris if uri.startswith(SITE_URI_PREFIX)]
    if len(named) != 1 or not SITE_ID.match(named[0]):
        return None
    return named[0]
