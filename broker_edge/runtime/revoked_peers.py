"""Connections whose client certificate a listener's new CRLs revoke (``tls.crlfile``, read again on SIGHUP).

OpenSSL checks a certificate against the CRLs only at the handshake, so a device connected when its
certificate is revoked (a stolen key) would stay connected for as long as it likes. A listener that checks
CRLs notes each client certificate's issuer and serial number at connect (``peer_chain.certificate_id``);
after a reload, ``close_revoked`` closes the connections the new CRLs list: v5 DISCONNECT 0x87 (Not
authorized), their wills dropped (they are the holder's of the stolen key), one WARNING each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.security.peer_chain import revoked_in

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import Connection

__all__ = ["close_revoked"]


def close_revoked(connections: Iterable[Connection], listener: str, crlfile: str) -> int:
    """Close the connections of ``listener`` whose certificate ``crlfile`` revokes; how many were."""
    revoked = revoked_in(crlfile)
    if not revoked:
        return 0
    closing = [
        conn
        for conn in connections
        if conn.terms.listener.name == listener and conn.peer_certificate in revoked
    ]
    for conn in closing:
        serial = conn.peer_certificate[1] if conn.peer_certificate else 0
        conn.log().warning(
            "closing the connection: its client certificate (CN=%s, serial %x) is revoked in %s",
            conn.peer_cn,
            serial,
            crlfile,
        )
        conn.will = None
        conn.close(ReasonCode.NOT_AUTHORIZED, "client certificate revoked")
        conn.flush()
    return len(closing)
