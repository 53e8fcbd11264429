"""The certificate the hub served a site's uplink, watched by the site: the link ends with its authorization.

OpenSSL checks the hub's certificate at the site's handshake only, and a link lasts for weeks: without this,
a site stayed connected to a hub whose certificate had expired, or whose CA a SIGHUP had taken out of the
site's ``uplink.tls.cafile`` (the end of a CA rotation, a CA found compromised). The site checks what the
hub presented as the hub checks the site's certificate, and as a member checks the peer links it dialed
(``http.peer_certificates.watch_dialed``, every second): the chain's end, and the CAs of ``cafile`` as the
site last read it (at its last dial or SIGHUP, whichever came later: the site reads its files at each
dial). A link no longer accepted is closed by the site, said once at WARNING naming the hub, counted in
``https_certificate_refusals_total{endpoint="uplink"}``; the site dials again, and that handshake succeeds
or fails as any.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from broker_edge.security.client_trust import ClientTrust

if TYPE_CHECKING:
    from broker_edge.observe.metrics import BrokerMetrics

__all__ = ["UPLINK_ENDPOINT", "HubCertificate"]

log = logging.getLogger("broker_edge.uplink.site_link")

UPLINK_ENDPOINT = "uplink"
"""The ``endpoint`` label of ``https_certificate_refusals_total`` for a site's uplink closed by the site."""


class HubCertificate:
    """The site's watch of the certificate of its link's hub (module docstring); ``cafile``: the site's
    ``uplink.tls.cafile``."""

    def __init__(self, cafile: str, metrics: BrokerMetrics) -> None:
        self.trust = ClientTrust(cafile)
        self._refusals = metrics.https_certificate_refusals_total
        self._watch: asyncio.Task[None] | None = None
        self.ended = False
        """Whether the link being watched was closed for its hub's certificate."""

    def reload(self) -> None:
        """Read ``cafile`` again (SIGHUP); raises when it does not read, the CAs in force kept."""
        self.trust.reload()

    def watch(self, hub: str, ws: Any) -> None:
        """At connect: close ``ws``, the link to ``hub``, once the certificate it presented is no longer
        accepted. ``cafile`` is read again first, as the dial just read it."""
        from broker_edge.http.peer_certificates import watch_dialed

        try:
            self.trust.reload()
        except (OSError, ValueError) as error:  # replaced since the dial: the CAs in force are kept
            log.error("uplink.tls.cafile %s not read again: %s", self.trust.cafile, error)
        self.ended = False
        self._watch = watch_dialed(f"uplink to {hub}", self.trust, self._counted, ws)

    def unwatch(self) -> None:
        """The link ended: nothing to watch."""
        if self._watch is not None:
            self._watch.cancel()
        self._watch = None

    def _counted(self, reason: str) -> None:
        """Told by the check before it closes the link."""
        self.ended = True
        self._refusals.labels(UPLINK_ENDPOINT, reason).inc()
