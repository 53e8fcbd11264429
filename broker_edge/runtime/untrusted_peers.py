"""Connections whose client certificate a listener's ``tls.cafile``, as a SIGHUP read it, no longer trusts.

OpenSSL checks a client certificate's chain at the handshake only, so a device connected with a
certificate of a CA taken out of ``cafile`` (the old CA at the end of a rotation, a CA found compromised)
would stay connected. Each connection on a listener verifying client certificates notes the CAs its chain
needs (``Connection.peer_trust``: its root, and the intermediates the device did not send); after a reload,
``close_untrusted`` closes those whose ``cafile``, as that reload read it (the listener's ``ClientTrust``),
lacks one: v5 DISCONNECT 0x87 (Not authorized, "client certificate no longer trusted"), an MQTT 3.1.1
client's connection closed, counted as ``certificate_untrusted``, their wills dropped (their CA no longer
vouches for them), one WARNING each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker_edge.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import Connection
    from broker_edge.security.client_trust import ClientTrust

__all__ = ["close_untrusted"]


def close_untrusted(connections: Iterable[Connection], listener: str, trust: ClientTrust) -> int:
    """Close the connections of ``listener`` whose certificate chain needs a CA the ``cafile`` of
    ``trust``'s last reload does not hold; how many were."""
    verdicts: dict[frozenset[bytes], bool] = {}  # one check per distinct chain, not per connection
    closing = []
    for conn in connections:
        needs = conn.peer_trust
        if needs is None or conn.terms.listener.name != listener:
            continue
        kept = verdicts.get(needs)
        if kept is None:
            kept = verdicts[needs] = not trust.lacks(needs)
        if not kept:
            closing.append(conn)
    for conn in closing:
        conn.log().warning(
            "closing the connection: its client certificate (CN=%s) is no longer trusted: %s lacks a CA "
            "its chain rests on",
            conn.peer_cn,
            trust.cafile,
        )
        conn.will = None
        conn.close(
            ReasonCode.NOT_AUTHORIZED,
            "client certificate no longer trusted",
            counted_as="certificate_untrusted",
        )
        conn.flush()
    return len(closing)
