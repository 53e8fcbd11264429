"""Connections whose client certificate a listener's reloaded ``tls.cafile`` no longer trusts (SIGHUP).

OpenSSL checks a client certificate's chain at the handshake only, so a device connected with a
certificate of a CA taken out of ``cafile`` (the old CA at the end of a rotation, a CA found compromised)
would stay connected. Each connection on a listener verifying client certificates notes the CAs its chain
needs (``Connection.peer_trust``: its root, and the intermediates the device did not send); after a reload,
``close_untrusted`` closes those whose ``cafile`` lacks one: v5 DISCONNECT 0x87 (Not authorized, "client
certificate no longer trusted"), an MQTT 3.1.1 client's connection closed, counted as
``certificate_untrusted``, their wills dropped (their CA no longer vouches for them), one WARNING each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.security.peer_chain import trusted_keys

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import Connection

__all__ = ["close_untrusted"]


def close_untrusted(connections: Iterable[Connection], listener: str, cafile: str) -> int:
    """Close the connections of ``listener`` whose certificate chain needs a CA ``cafile`` does not hold;
    how many were."""
    trusted = trusted_keys(cafile)
    verdicts: dict[frozenset[bytes], bool] = {}  # one check per distinct chain, not per connection
    closing = []
    for conn in connections:
        needs = conn.peer_trust
        if needs is None or conn.terms.listener.name != listener:
            continue
        kept = verdicts.get(needs)
        if kept is None:
            kept = verdicts[needs] = needs <= trusted
        if not kept:
            closing.append(conn)
    for conn in closing:
        conn.log().warning(
            "closing the connection: its client certificate (CN=%s) is no longer trusted: %s lacks a CA "
            "its chain rests on",
            conn.peer_cn,
            cafile,
        )
        conn.will = None
        conn.close(
            ReasonCode.NOT_AUTHORIZED,
            "client certificate no longer trusted",
            counted_as="certificate_untrusted",
        )
        conn.flush()
    return len(closing)
