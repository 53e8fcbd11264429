"""What a TLS listener notes of a client's certificate as its connection opens, on every transport: the name
it logs in with (CN, Timestone URI), its issuer and serial number for the CRLs (``revoked_peers``; those of
the CAs of its chain too when the listener checks the chain), and the end and the CAs of its chain, watched
(``certificate_ends``, ``untrusted_peers``).

A resumed TLS session is not verified again by OpenSSL: a session begun before a SIGHUP that revoked the
certificate, or took its CA out of ``cafile``, would let it back in (the holder of a stolen key who kept
one). Such a connection is refused (``resumed_refusal``), checked against what the listener's last reload
read (its ``ServerContexts.trust``)."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from broker_edge.security.peer_chain import certificate_id
from broker_edge.security.tls import peer_common_name, peer_timestone_uri

if TYPE_CHECKING:
    from broker_edge.engine.connection.certificate_ends import CallLater
    from broker_edge.engine.connection.connection import Connection
    from broker_edge.engine.connection.terms import ListenerRuntime

__all__ = ["note_peer_certificate", "refuse_resumed", "resumed_refusal"]


def note_peer_certificate(
    conn: Connection,
    listener: ListenerRuntime,
    ssl_object: ssl.SSLObject | ssl.SSLSocket | None,
    call_later: CallLater,
) -> None:
    """Note on ``conn`` what its listener needs of the client certificate of ``ssl_object``."""
    conn.peer_cn = peer_common_name(ssl_object)
    if conn.peer_cn is not None:
        conn.peer_uri = peer_timestone_uri(ssl_object)
    if listener.checks_crl:
        conn.peer_certificate = certificate_id(ssl_object)
    if listener.certificate_ends is not None:
        chain = listener.certificate_ends.watch_chain(conn, ssl_object, call_later)
        if chain is not None:
            conn.peer_trust = chain.needs
            trust = listener.tls_contexts.trust if listener.tls_contexts is not None else None
            if trust is not None and trust.chain:
                conn.peer_cas = chain.cas


def resumed_refusal(
    conn: Connection, listener: ListenerRuntime, ssl_object: ssl.SSLObject | ssl.SSLSocket | None
) -> tuple[str, str] | None:
    """Why ``conn``, on a TLS session resumed after a reload of its listener that no longer accepts its
    certificate, is refused (the reason it is counted as, and the line to say), or None (noted first)."""
    contexts = listener.tls_contexts
    if ssl_object is None or not ssl_object.session_reused or contexts is None:
        return None
    trust = contexts.trust
    if trust is None or not trust.reloads:
        return None  # the session was verified against the files in force
    return trust.refusal(conn.peer_certificate, conn.peer_trust, conn.peer_cn, cas=conn.peer_cas)


def refuse_resumed(conn: Connection, reason: str, line: str) -> None:
    """Refuse ``conn`` before its CONNECT is read (``resumed_refusal``): counted as ``reason``, one line in
    the broker's refusal lines, closed."""
    host = conn.terms.host
    message = f"connection refused: {reason} ({line}; a TLS session resumed after the reload)"
    host.counters.refusal_log.write(conn.log, host.now(), reason, message, action="connect")
    conn.refuse(reason, None)
