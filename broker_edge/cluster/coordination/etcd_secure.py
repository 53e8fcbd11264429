"""aetcd over TLS with etcd's user authentication: what aetcd 1.0.0 lacks, in one small subclass.

aetcd speaks etcd's gRPC API over plaintext channels only, and authenticates once, at connect, with a
password given to its constructor. ``SecureClient`` overrides ``connect`` alone (the same stubs and watcher
as aetcd's own, set up the same way) to

- open a ``grpc.aio.secure_channel``: the etcd servers' CA, and the client certificate and key etcd's
  ``--client-cert-auth`` asks for, read from their files when the channel is opened (a client made again
  after SIGHUP, ``Etcd.renew``, takes renewed files);
- authenticate as ``cluster.etcd_auth.username`` with the password read from its file at every
  authentication (a password changed with ``etcdctl user passwd`` and written to the file is taken without
  a restart). An authentication that fails (etcd down) leaves the channel open: the next connect tries
  again on it, gRPC reconnecting meanwhile, instead of opening a channel per attempt (while etcd was down
  that was one per call, each of them closed but held by its error's traceback until a collection, and
  gRPC's threads spent CPU on every channel not yet freed).

etcd forgets its simple auth tokens when it restarts (and after five idle minutes): a call then fails with
"invalid auth token", and ``reauthenticate`` gets a new token, which every stub and the watcher use from
then on (``Etcd`` does so and repeats the call once).
"""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc, watcher
from cryptography import x509

from broker_edge.settings.cluster import EtcdAuthConfig, EtcdTlsConfig

__all__ = ["SecureClient", "channel_credentials", "tls_failure_said"]


def channel_credentials(tls: EtcdTlsConfig) -> grpc.ChannelCredentials:
    """The gRPC credentials of ``tls``, from its files as they are now (``OSError`` if one is missing)."""
    key = Path(tls.keyfile).read_bytes() if tls.keyfile else None
    certificate = Path(tls.certfile).read_bytes() if tls.certfile else None
    return grpc.ssl_channel_credentials(Path(tls.cafile).read_bytes(), key, certificate)


_TLS_FAILURES = ("handshake", "Unwrap failed", "TSI_", "SSL_ERROR", "ALERT")
"""What gRPC says of a TLS handshake that failed, on either side (a client certificate etcd refused reaches
the client as "Unwrap failed (TSI_DATA_CORRUPTED)" under TLS 1.3)."""


def _out_of_date(path: str, now: datetime.datetime) -> str | None:
    """How the certificates of ``path`` are out of date at ``now`` (all of them: a CA file may hold an old
    and a new CA), or None (valid, or not readable: the channel says so itself)."""
    try:
        certificates = x509.load_pem_x509_certificates(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    if not certificates:
        return None
    if all(certificate.not_valid_after_utc < now for certificate in certificates):
        ended = max(certificate.not_valid_after_utc for certificate in certificates)
        return f"expired {ended:%Y-%m-%d %H:%M:%S} UTC"
    if all(certificate.not_valid_before_utc > now for certificate in certificates):
        starts = min(certificate.not_valid_before_utc for certificate in certificates)
        return f"not valid before {starts:%Y-%m-%d %H:%M:%S} UTC"
    return None


def tls_failure_said(details: str, tls: EtcdTlsConfig) -> str:
    """What to do about etcd unreachable over ``tls`` (gRPC's ``details``): a client certificate or CA
    file out of date, etcd's certificate not signed by a CA of ``cafile``, a handshake etcd refused; "" when
    nothing points at TLS. The files are read as they are now: the channel took them when it was made, and
    a channel is made again with them at SIGHUP."""
    now = datetime.datetime.now(datetime.UTC)
    reload = "then send the broker SIGHUP (it reads the etcd TLS files again)"
    if tls.certfile is not None and (ended := _out_of_date(tls.certfile, now)) is not None:
        return (
            f" (etcd_tls.certfile {tls.certfile}, the client certificate, {ended}: etcd refuses it; "
            f"renew it (timestone pki renew), {reload})"
        )
    if (ended := _out_of_date(tls.cafile, now)) is not None:
        return f" (etcd_tls.cafile {tls.cafile}, etcd's CA, {ended}: write etcd's current CA there, {reload})"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (
            f" (etcd's certificate was not accepted against etcd_tls.cafile {tls.cafile}: if etcd's CA "
            f"changed, put the new CA there (both while etcd moves), {reload})"
        )
    if any(marker in details for marker in _TLS_FAILURES):
        if tls.certfile is None:
            return (
                " (the TLS handshake with etcd failed: does etcd ask for a client certificate "
                f"(--client-cert-auth)? Set etcd_tls.certfile and keyfile, {reload})"
            )
        return (
            f" (the TLS handshake with etcd failed: does etcd's --trusted-ca-file hold the CA of "
            f"etcd_tls.certfile {tls.certfile}? After changing a file, {reload})"
        )
    return ""


class SecureClient(aetcd.Client):
    """An aetcd client whose channel is secure when ``tls`` is given and that authenticates with ``auth``
    when given (either may be None: a plain or anonymous connection, as aetcd's own)."""

    _is_connecting: bool
    metadata: tuple[tuple[str, str], ...] | None
    channel: grpc.aio.Channel | None

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float,
        options: dict[str, Any],
        tls: EtcdTlsConfig | None,
        auth: EtcdAuthConfig | None,
    ) -> None:
        channel_options = dict(options)
        if tls is not None and tls.server_name:
            channel_options["grpc.ssl_target_name_override"] = tls.server_name
        super().__init__(host=host, port=port, timeout=timeout, options=channel_options)
        self._tls = tls
        self._auth = auth
        self._authenticating: asyncio.Lock | None = None

    def _open_channel(self) -> grpc.aio.Channel:
        target = f"{self._host}:{self._port}"
        options = list(self._options.items())
        if self._tls is None:
            return rpc.insecure_channel(target, options=options)
        return grpc.aio.secure_channel(target, channel_credentials(self._tls), options=options)

    async def connect(self) -> None:
        """As ``aetcd.Client.connect``, over a secure channel and with a password read from its file."""
        if self._connected.is_set():
            return
        if self._is_connecting:  # another task is connecting: wait for it
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        self._is_connecting = True
        try:
            if self.channel is None:
                try:
                    self.channel = self._open_channel()
                except OSError as error:
                    raise aetcd.exceptions.ConnectionFailedError(f"etcd TLS files: {error}") from error
            if self._auth is not None:
                await self._authenticate()  # on failure the channel stays, for the next connect
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False

    async def _authenticate(self) -> None:
        auth = self._auth
        assert auth is not None and self.channel is not None
        try:
            password = auth.password()
        except OSError as error:
            raise aetcd.exceptions.UnauthenticatedError(
                f"etcd_auth.password_file: cannot read {auth.password_file}: {error}"
            ) from error
        request = rpc.AuthenticateRequest(name=auth.username, password=password)
        try:
            answer = await rpc.AuthStub(self.channel).Authenticate(request, timeout=self._timeout)
        except rpc.AioRpcError as error:
            try:
                aetcd.exceptions._handle_exception(error)
            except aetcd.exceptions.ClientError as refused:
                if "authentication failed" not in str(refused):
                    raise
                raise type(refused)(  # a wrong user or password: say which setting holds them
                    f"{refused} (user {auth.username!r} (cluster.etcd_auth), its password the first line of "
                    f"{auth.password_file})"
                ) from error
        self.metadata = (("token", answer.token),)
        if self._watcher is not None:
            self._watcher._metadata = self.metadata  # a watch stream made from now on carries it

    async def reauthenticate(self) -> bool:
        """Get a new auth token (etcd forgot the last one). False when there is no user to authenticate as
        or the client is not connected yet (the next connect authenticates)."""
        if self._auth is None or not self._connected.is_set():
            return False
        if self._authenticating is None:
            self._authenticating = asyncio.Lock()
        async with self._authenticating:
            await self._authenticate()
        return True
