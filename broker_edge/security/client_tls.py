"""TLS of the broker's own clients (the Spark source and the jobs reading the offsets API over HTTPS, the jobs
publishing over MQTT on a TLS listener): which CAs they trust, and the certificate they present.

A ``ClientTls`` is plain paths, so it travels to Spark executors; each process builds its ``SSLContext``
once per set of files and builds it again when one of them changes (a certificate renewed in place).
Without a ``cafile`` the system's CAs are trusted; a broker whose certificate ``timestone pki`` issued
needs that CA's ``ca.pem``.
"""

from __future__ import annotations

import os
import ssl
import threading
from dataclasses import dataclass

from broker_edge.config import ConfigError
from broker_edge.security.tls import load_key_pair

__all__ = ["ClientTls", "context_for"]


@dataclass(frozen=True, slots=True)
class ClientTls:
    """The files a client's TLS is made of (see the module docstring)."""

    cafile: str | None = None
    """PEM file of the CA certificates the server's certificate must chain to (None: the system's)."""
    certfile: str | None = None
    """PEM file of the certificate to present, for a server that asks for client certificates."""
    keyfile: str | None = None
    """PEM file of ``certfile``'s private key (unencrypted; None: it is in ``certfile``)."""

    def __post_init__(self) -> None:
        if self.keyfile is not None and self.certfile is None:
            raise ConfigError("keyfile", "is the key of certfile, which is not set")

    def context(self) -> ssl.SSLContext:
        """The client ``SSLContext`` of these files (``ConfigError`` naming the one that does not load)."""
        stamp = tuple(_modified(path) for path in (self.cafile, self.certfile, self.keyfile))
        with _LOCK:
            cached = _CONTEXTS.get(self)
            if cached is not None and cached[0] == stamp:
                return cached[1]
        context = self._build()
        with _LOCK:
            _CONTEXTS[self] = (stamp, context)
        return context

    def _build(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=self.cafile)
        except OSError as error:  # ssl.SSLError too: not PEM, no certificate in it
            raise ConfigError("cafile", f"cannot load CA certificates from {self.cafile}: {error}") from None
        if self.certfile is not None:
            try:
                load_key_pair(context, self.certfile, self.keyfile)
            except OSError as error:
                files = self.certfile if self.keyfile is None else f"{self.certfile}, key {self.keyfile}"
                raise ConfigError("certfile", f"cannot load certificate and key ({files}): {error}") from None
        return context


def context_for(url: str, tls: ClientTls | None) -> ssl.SSLContext | None:
    """The ``SSLContext`` of ``tls`` for ``url`` when it is ``https://`` (None: plain HTTP, or no files given:
    the system's CAs)."""
    return tls.context() if tls is not None and url.lower().startswith("https://") else None


_CONTEXTS: dict[ClientTls, tuple[tuple[float | None, ...], ssl.SSLContext]] = {}
_LOCK = threading.Lock()


def _modified(path: str | None) -> float | None:
    """When ``path`` last changed (None: no path, or no such file: loading it says why)."""
    if path is None:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
