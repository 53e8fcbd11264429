"""TLS contexts from ``TlsConfig``, exercised by real handshakes between a server and a client on loopback."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.security.tls import TlsConfig, peer_common_name, server_ssl_context
from tests.tls_certs import PkiPaths, client_ssl_context, make_test_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PkiPaths:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@dataclass
class Exchange:
    """What one connection attempt produced on each side."""

    reply: bytes | None = None
    client_error: BaseException | None = None
    server_peers: list[str | None] = field(default_factory=list)
    server_versions: list[str] = field(default_factory=list)


async def _exchange(server_context: ssl.SSLContext, client_context: ssl.SSLContext) -> Exchange:
    """Echo one line over TLS; the server records the client's certificate CN and the TLS version."""
    result = Exchange()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_object = writer.get_extra_info("ssl_object")
        result.server_peers.append(peer_common_name(ssl_object))
        result.server_versions.append(ssl_object.version())
        line = await reader.readline()
        writer.write(b"echo " + line)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context, server_hostname="localhost"
        )
        writer.write(b"hello\n")
        await writer.drain()
        result.reply = await reader.readline() or None
        writer.close()
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError) as exc:
        result.client_error = exc
    finally:
        server.close()
        await server.wait_closed()
    return result


def exchange(server_context: ssl.SSLContext, client_context: ssl.SSLContext) -> Exchange:
    return asyncio.run(asyncio.wait_for(_exchange(server_context, client_context), 20))


def config(pki: PkiPaths, **overrides: Any) -> TlsConfig:
    return TlsConfig(certfile=str(pki.server_cert), keyfile=str(pki.server_key), **overrides)


def test_server_only_tls(pki: PkiPaths) -> None:
    result = exchange(server_ssl_context(config(pki)), client_ssl_context(pki, certificate=False))
    assert result.reply == b"echo hello\n"
    assert result.server_peers == [None]


def test_client_that_does_not_trust_the_ca_rejects_the_server(pki: PkiPaths) -> None:
    result = exchange(
        server_ssl_context(config(pki)), client_ssl_context(pki, certificate=False, trust=pki.other_ca_cert)
    )
    assert isinstance(result.client_error, ssl.SSLCertVerificationError)
    assert result.server_peers == []


def test_required_client_certificate_is_accepted_and_identified(pki: PkiPaths) -> None:
    context = server_ssl_context(config(pki, cafile=str(pki.ca_cert), require_client_cert=True))
    result = exchange(context, client_ssl_context(pki))
    assert result.reply == b"echo hello\n"
    assert result.server_peers == [pki.client_common_name]


def test_required_client_certificate_missing_fails_the_handshake(pki: PkiPaths) -> None:
    context = server_ssl_context(config(pki, cafile=str(pki.ca_cert), require_client_cert=True))
    result = exchange(context, client_ssl_context(pki, certificate=False))
    assert result.reply is None
    assert result.server_peers == [], "the connection never reached the application"


def test_client_certificate_from_another_ca_is_rejected(pki: PkiPaths) -> None:
    context = server_ssl_context(config(pki, cafile=str(pki.ca_cert)))  # optional, but verified when sent
    client = client_ssl_context(pki, certificate=False)
    client.load_cert_chain(str(pki.other_client_cert), str(pki.other_client_key))
    result = exchange(context, client)
    assert result.reply is None
    assert result.server_peers == []


def test_optional_client_certificate(pki: PkiPaths) -> None:
    context = server_ssl_context(config(pki, cafile=str(pki.ca_cert)))
    assert exchange(context, client_ssl_context(pki, certificate=False)).server_peers == [None]
    assert exchange(context, client_ssl_context(pki)).server_peers == [pki.client_common_name]


def test_minimum_version_is_enforced(pki: PkiPaths) -> None:
    old_client = client_ssl_context(pki, certificate=False)
    old_client.maximum_version = ssl.TLSVersion.TLSv1_2
    assert exchange(server_ssl_context(config(pki)), old_client).server_versions == ["TLSv1.2"]
    strict = exchange(server_ssl_context(config(pki, min_version="TLSv1.3")), old_client)
    assert strict.reply is None
    assert isinstance(strict.client_error, (ssl.SSLError, ConnectionError))
    assert strict.server_versions == []


def test_config_checks_name_the_field(pki: PkiPaths, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^tls\.cafile: required when require_client_cert"):
        load_dataclass(TlsConfig, {"certfile": "c", "keyfile": "k", "require_client_cert": True}, "tls")
    with pytest.raises(ConfigError, match=r"^tls\.min_version: expected one of"):
        load_dataclass(TlsConfig, {"certfile": "c", "keyfile": "k", "min_version": "TLSv1.0"}, "tls")
    with pytest.raises(ConfigError, match=r"^tls\.keyfile: required key is missing"):
        load_dataclass(TlsConfig, {"certfile": "c"}, "tls")
    with pytest.raises(ConfigError, match=r"^keyfile: file not found"):
        server_ssl_context(TlsConfig(str(pki.server_cert), str(tmp_path / "missing.key")))
    with pytest.raises(ConfigError, match=r"^certfile: cannot load certificate/key"):
        server_ssl_context(TlsConfig(str(pki.server_cert), str(pki.client_key)))  # key of another cert
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"^cafile: cannot load CA certificates"):
        server_ssl_context(config(pki, cafile=str(garbage)))


def test_pki_helper_writes_private_keys_with_mode_0600(pki: PkiPaths) -> None:
    for key in (pki.ca_key, pki.server_key, pki.client_key, pki.other_client_key):
        assert key.stat().st_mode & 0o077 == 0
