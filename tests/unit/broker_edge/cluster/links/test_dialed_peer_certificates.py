"""The member that dials a peer link checks, for as long as the link lasts, the certificate the other
member served at the handshake, as the serving member checks the dialer's: the link is closed once that
certificate expires, or once a reload of the dialer's ``cluster.tls.cafile`` no longer holds its CA; said,
counted, and dialed again (refused at the handshake until the other member's certificate is renewed, then
up). A kept-alive connection to a member is checked the same way before each request it would carry. Real
TLS on loopback, real members' endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from broker_edge.cluster.links.member_clients import MemberClients
from broker_edge.cluster.links.member_identity import MemberTls
from broker_edge.cluster.links.peer_link import PeerLinks
from broker_edge.runtime.local_pki import LocalPki, PemPair
from broker_edge.settings.cluster import MemberTlsConfig
from tests.e2e.security.certificate_devices import reissued
from tests.unit.broker_edge.cluster.links.test_member_identity import Endpoint, Quiet, _get, until

LIFETIME_S = 6.0
"""How long b1's short-lived member certificate holds: time enough for the link to come up on a busy
machine."""


def member_files(pki: LocalPki, node: str, live: Path) -> PemPair:
    """``node``'s certificate and key of ``pki``, copied where its broker reads them (swapped later)."""
    live.mkdir(parents=True, exist_ok=True)
    files = PemPair(live / f"{node}.pem", live / f"{node}.key")
    shutil.copy(pki.member(node).cert, files.cert)
    shutil.copy(pki.member(node).key, files.key)
    return files


def write_cas(path: Path, *pkis: LocalPki) -> Path:
    path.write_bytes(b"".join(pki.ca.cert.read_bytes() for pki in pkis))
    return path


def member_tls(files: PemPair, cafile: Path, node: str) -> MemberTls:
    return MemberTls(MemberTlsConfig(str(files.cert), str(files.key), str(cafile)), node)


def closes_said(caplog: pytest.LogCaptureFixture, containing: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith("peer link to b1: closing")
        if containing in r.getMessage()
    ]


async def linked(a1_links: PeerLinks, b1_links: PeerLinks) -> bool:
    return await until(lambda: a1_links.up("b1") and b1_links.up("a1"))


def short_lived_b1(pki: LocalPki, live: Path) -> tuple[PemPair, datetime.datetime]:
    """b1's files (``member_files``) holding a certificate of ``LIFETIME_S``, and when it ends."""
    files = member_files(pki, "b1", live)
    now = datetime.datetime.now(datetime.UTC)
    ends = now + datetime.timedelta(seconds=LIFETIME_S)
    reissued(files, pki.ca, now - datetime.timedelta(minutes=5), ends)
    return files, ends


@contextlib.asynccontextmanager
async def link_dialed_by_a1(
    tmp_path: Path, a1_tls: MemberTls, b1_tls: MemberTls, refused: Callable[[str], None]
) -> AsyncIterator[tuple[PeerLinks, PeerLinks, Endpoint]]:
    """a1's and b1's peer links and b1's members' endpoint, the link dialed by a1 (the smaller node id)
    and up; a1's links tell ``refused`` why they closed a link."""
    b1_links = PeerLinks("b1", None, Quiet())
    endpoint = Endpoint(tmp_path, b1_tls, members=("a1", "b1"))
    endpoint.routes.append(b1_links.add_routes)
    async with endpoint:
        a1_links = PeerLinks("a1", MemberClients("a1", a1_tls), Quiet(), refused=refused)
        a1_links.update({"b1": endpoint.url})
        assert await linked(a1_links, b1_links)
        yield a1_links, b1_links, endpoint
        await a1_links.close()
        await b1_links.close()


def test_a_link_is_closed_once_a_reload_of_the_dialers_cafile_no_longer_trusts_the_peers_ca(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The end of a CA rotation on a1, which dialed b1: a1's ``cafile`` is read without b1's CA. The link
    is closed by a1 (where it stayed up), said naming b1 and counted; a1 dials again, refused at each
    handshake, and is linked again once b1 serves a certificate of the CA a1 trusts."""
    caplog.set_level(logging.WARNING)
    old_pki, new_pki = LocalPki(tmp_path / "old"), LocalPki(tmp_path / "new")
    b1_files = member_files(old_pki, "b1", tmp_path / "live")
    b1_tls = member_tls(b1_files, write_cas(tmp_path / "b1-cas.pem", old_pki, new_pki), "b1")
    a1_cas = write_cas(tmp_path / "a1-cas.pem", old_pki, new_pki)
    a1_tls = member_tls(member_files(new_pki, "a1", tmp_path / "live"), a1_cas, "a1")
    dialed: list[str] = []

    async def scenario() -> None:
        link = link_dialed_by_a1(tmp_path, a1_tls, b1_tls, dialed.append)
        async with link as (a1_links, b1_links, endpoint):
            write_cas(a1_cas, new_pki)
            a1_tls.reload()
            assert await until(lambda: not a1_links.up("b1") and not b1_links.up("a1"))
            assert dialed == ["certificate_untrusted"] and endpoint.refused == []
            said = closes_said(caplog, "its server certificate (CN=b1) is no longer trusted")
            assert len(said) == 1 and str(a1_cas) in said[0], said
            assert await until(lambda: failed_dials(caplog) >= 1)  # dialed again, refused at the handshake
            assert not a1_links.up("b1")
            shutil.copy(new_pki.member("b1").cert, b1_files.cert)
            shutil.copy(new_pki.member("b1").key, b1_files.key)
            b1_tls.reload()
            assert await linked(a1_links, b1_links)
            assert dialed == ["certificate_untrusted"]

    asyncio.run(scenario())


def failed_dials(caplog: pytest.LogCaptureFixture) -> int:
    """a1's dials of b1 that failed (the first said at WARNING)."""
    return sum(1 for r in caplog.records if r.getMessage().startswith("peer link to b1 at "))


def test_a_link_is_closed_once_the_certificate_the_peer_served_expires(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """b1's member certificate of a few seconds: a1, which dialed b1 with it in force, closes the link once
    it has expired, says so naming b1 and counts it; a1's next dials fail at the handshake until b1 reads a
    renewed certificate, then the link is up again."""
    caplog.set_level(logging.WARNING)
    pki = LocalPki(tmp_path / "pki")
    b1_files, _ = short_lived_b1(pki, tmp_path / "live")
    b1_tls = member_tls(b1_files, pki.ca.cert, "b1")
    a1_tls = member_tls(pki.member("a1"), pki.ca.cert, "a1")
    dialed: list[str] = []

    async def scenario() -> None:
        link = link_dialed_by_a1(tmp_path, a1_tls, b1_tls, dialed.append)
        async with link as (a1_links, b1_links, endpoint):
            assert await until(lambda: not a1_links.up("b1"), timeout=LIFETIME_S + 30)
            assert dialed == ["certificate_expired"] and endpoint.refused == []
            said = closes_said(caplog, "its server certificate expired at")
            assert len(said) == 1 and "(CN=b1)" in said[0], said
            assert await until(lambda: failed_dials(caplog) >= 1)
            shutil.copy(pki.member("b1").cert, b1_files.cert)  # renewed
            b1_tls.reload()
            assert await linked(a1_links, b1_links)
            assert dialed == ["certificate_expired"]

    asyncio.run(scenario())


def test_a_kept_alive_connection_to_a_member_is_not_reused_once_its_certificate_is_no_longer_accepted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Replica fetches and the other requests between members reuse kept-alive connections for as long as
    they come: a2 asked b1 on one opened with b1's certificate of a few seconds. Once it has expired, a2's
    next request is not sent on it: the connection is closed (said naming b1, counted) and a new one fails at
    its handshake, where the request was answered. A certificate renewed on b1 is asked again at once."""
    caplog.set_level(logging.WARNING)
    pki = LocalPki(tmp_path / "pki")
    b1_files, ends = short_lived_b1(pki, tmp_path / "live")
    b1_tls = member_tls(b1_files, pki.ca.cert, "b1")
    dialed: list[str] = []

    async def scenario() -> None:
        async with Endpoint(tmp_path, b1_tls, members=("a2", "b1")) as endpoint:
            a2 = MemberClients("a2", member_tls(pki.member("a2"), pki.ca.cert, "a2"), refused=dialed.append)
            assert await _get(a2, "b1", endpoint.url) == (200, "a2")
            assert await until(lambda: datetime.datetime.now(datetime.UTC) > ends, timeout=LIFETIME_S + 30)
            with pytest.raises(aiohttp.ClientError, match="certificate has expired"):
                await _get(a2, "b1", endpoint.url)
            assert dialed == ["certificate_expired"] and endpoint.seen == ["a2"]
            said = [
                r.getMessage() for r in caplog.records if "closing a kept-alive connection" in r.getMessage()
            ]
            assert len(said) == 1 and "its server certificate expired at" in said[0] and "b1" in said[0], said
            shutil.copy(pki.member("b1").cert, b1_files.cert)  # renewed
            b1_tls.reload()
            assert await _get(a2, "b1", endpoint.url) == (200, "a2")
            assert dialed == ["certificate_expired"]
            await a2.close()

    asyncio.run(scenario())
