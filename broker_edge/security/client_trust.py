"""The client certificates a TLS server's files accept as of their last reload (SIGHUP): its CAs and the
certificates its CRLs revoke.

OpenSSL checks a client certificate against ``cafile`` and ``crlfile`` at a full handshake only: what a
reload takes out of ``cafile``, or adds to the CRLs, is not checked on a connection opened before it, nor
on a TLS session resumed after it, nor on the next request of a kept-alive HTTPS connection. Each server
(``ServerContexts``: an MQTT listener, the offsets API, the members' endpoint, the uplink hub) holds one
``ClientTrust``, which its ``reload`` reads with the new context: every check of those connections
(``runtime.peer_certificate``, ``runtime.revoked_peers``, ``runtime.untrusted_peers``,
``http.peer_certificates``, ``uplink.site_certificates``) asks it, and no check reads the files again. A
process that dials a long-lived link (a member's peer links, a site's uplink) asks its own CAs'
``ClientTrust`` the same of the certificate the server presented (``http.peer_certificates.watch_dialed``).
Until the first reload it holds nothing: a connection was verified by OpenSSL against the files in force.
"""

from __future__ import annotations

from broker_edge.security.peer_chain import CertificateId, revoked_in, trusted_keys

__all__ = ["ClientTrust"]


class ClientTrust:
    """The CAs of ``cafile`` and the certificates the CRLs of ``crlfile`` list, as its ``reloads``-th reload
    read them (module docstring); with ``chain`` (``tls.crl_check: chain``) the CRLs revoke the CAs of a
    chain too."""

    __slots__ = ("cafile", "chain", "crlfile", "reloads", "revoked", "trusted")

    def __init__(self, cafile: str, crlfile: str | None = None, chain: bool = False) -> None:
        self.cafile = cafile
        self.crlfile = crlfile
        self.chain = chain
        self.reloads = 0
        """The reloads read so far (0: none since the start)."""
        self.trusted: frozenset[bytes] = frozenset()
        """The keys of the CAs of ``cafile`` (``peer_chain.trusted_keys``), as last reloaded."""
        self.revoked: frozenset[CertificateId] = frozenset()
        """Every certificate the CRLs list, as last reloaded (none without ``crlfile``)."""

    def reload(self) -> None:
        """Read the files again (both, or neither when one does not read: it raises)."""
        trusted = trusted_keys(self.cafile)
        revoked = frozenset(revoked_in(self.crlfile)) if self.crlfile else frozenset()
        self.trusted, self.revoked = trusted, revoked
        self.reloads += 1

    def revokes(self, certificate: CertificateId | None, cas: frozenset[CertificateId] | None = None) -> bool:
        """Whether the last reload's CRLs list ``certificate`` (its issuer and serial number), or, checking
        the chain, a CA ``cas`` of its chain (``peer_chain``)."""
        if certificate is None:
            return False
        return certificate in self.revoked or self.revoked_ca(cas) is not None

    def revoked_ca(self, cas: frozenset[CertificateId] | None) -> CertificateId | None:
        """The CA of ``cas`` (a chain's) the last reload's CRLs list, when they are checked for the chain."""
        if self.chain and cas:
            for ca in cas:
                if ca in self.revoked:
                    return ca
        return None

    def revocation_said(
        self,
        certificate: CertificateId | None,
        cas: frozenset[CertificateId] | None,
        name: str | None,
        whose: str = "client certificate",
    ) -> str:
        """The words for ``certificate`` (CN ``name``), which the last reload revokes (``revokes``): the CA
        of ``cas`` its CRLs list, checking the chain, else ``whose`` own, by its serial number."""
        return self._revoked_said(certificate, self.revoked_ca(cas), name, whose)

    def _revoked_said(
        self, certificate: CertificateId | None, ca: CertificateId | None, name: str | None, whose: str
    ) -> str:
        if ca is not None:
            return _revoked_ca_said(ca, self.crlfile, name)
        serial = certificate[1] if certificate else 0
        return f"its {whose} (CN={name}, serial {serial:x}) is revoked in {self.crlfile}"

    def lacks(self, needs: frozenset[bytes] | None) -> bool:
        """Whether a chain needing the CAs ``needs`` (``peer_chain``) rests on a CA the last reload's
        ``cafile`` does not hold (never before the first reload)."""
        return self.reloads > 0 and needs is not None and not needs <= self.trusted

    def refusal(
        self,
        certificate: CertificateId | None,
        needs: frozenset[bytes] | None,
        name: str | None,
        side: str = "client",
        cas: frozenset[CertificateId] | None = None,
    ) -> tuple[str, str] | None:
        """Why the last reload no longer accepts the ``side`` ("client", or "server" for the other end of a
        connection this process dialed) certificate ``certificate`` (CN ``name``) whose chain needs
        ``needs`` and holds the CAs ``cas``: the reason it is counted as and the words that say so, or
        None."""
        ca = self.revoked_ca(cas)
        if ca is not None or self.revokes(certificate):
            return "certificate_revoked", self._revoked_said(certificate, ca, name, f"{side} certificate")
        if self.lacks(needs):
            return (
                "certificate_untrusted",
                f"its {side} certificate (CN={name}) is no longer trusted: {self.cafile} lacks a CA its "
                "chain rests on",
            )
        return None


def _revoked_ca_said(ca: CertificateId, crlfile: str | None, name: str | None) -> str:
    """The words for the chain of the certificate of CN ``name`` whose CA ``ca`` the CRLs of ``crlfile``
    revoke."""
    return f"the certificate of a CA of its chain (serial {ca[1]:x}) is revoked in {crlfile} (CN={name})"
