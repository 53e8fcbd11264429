"""Members' identities over real TLS on loopback: who a certificate names, the check a connection makes
before it sends anything, the members' endpoint admitting only current members as themselves, reloads."""

from __future__ import annotations

import asyncio
import datetime
import shutil
import ssl
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from broker_edge.cluster.links.member_api import bind_members_endpoint, serve_members_endpoint
from broker_edge.cluster.links.member_clients import NODE_HEADER, MemberClients, NotThatMember
from broker_edge.cluster.links.member_identity import (
    MemberTls,
    member_uri,
    node_of_certificate,
    node_of_certificate_file,
)
from broker_edge.cluster.links.member_proofs import MemberProofs
from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
from broker_edge.cluster.view import ClusterView
from broker_edge.config.loader import ConfigError
from broker_edge.offsets_api.server import access_of
from broker_edge.placement import Member
from broker_edge.runtime.local_pki import LocalPki, PemPair
from broker_edge.settings.cluster import MemberListenConfig, MemberTlsConfig
from broker_edge.storage import LogStore, StorageConfig


def tls_of(pki: LocalPki, node: str, certificate_of: str | None = None) -> MemberTls:
    """``node``'s TLS, with the certificate of ``certificate_of`` (another node's, to forge)."""
    member = pki.member(certificate_of or node)
    config = MemberTlsConfig(str(member.cert), str(member.key), str(pki.ca.cert))
    if certificate_of is None:
        return MemberTls(config, node)
    tls = MemberTls(config, certificate_of)  # a stolen certificate: it names certificate_of
    tls.node_id = node
    return tls


def test_a_certificate_names_one_node_by_its_uri() -> None:
    def peercert(*uris: str) -> dict:
        return {"subjectAltName": (*(("URI", uri) for uri in uris), ("IP Address", "127.0.0.1"))}

    assert node_of_certificate(peercert(member_uri("b1"))) == "b1"
    assert node_of_certificate(peercert()) is None
    assert node_of_certificate(peercert(member_uri("b1"), member_uri("b2"))) is None  # one, not two
    assert node_of_certificate(peercert("timestone://node/../b1")) is None
    assert node_of_certificate(peercert("spiffe://cluster/b1")) is None
    assert node_of_certificate(None) is None


def test_a_broker_refuses_a_certificate_that_does_not_name_it(tmp_path: Path) -> None:
    pki = LocalPki(tmp_path)
    named, expires = node_of_certificate_file(str(pki.member("b1").cert))
    assert named == "b1" and expires > datetime.datetime.now(datetime.UTC)
    member = pki.member("b2")
    with pytest.raises(ConfigError, match=r"cluster\.tls\.certfile: must name this node .*names 'b2'"):
        MemberTls(MemberTlsConfig(str(member.cert), str(member.key), str(pki.ca.cert)), "b1")
    server = pki.server("etcd")  # a certificate naming no member at all
    with pytest.raises(ConfigError, match="names None"):
        MemberTls(MemberTlsConfig(str(server.cert), str(server.key), str(pki.ca.cert)), "b1")
    with pytest.raises(ConfigError, match=r"cluster\.tls\.cafile: file not found"):
        MemberTls(MemberTlsConfig(str(member.cert), str(member.key), str(tmp_path / "none.pem")), "b2")


class Endpoint:
    """A members' endpoint of node ``b1`` on loopback, whose one route says who it admitted."""

    def __init__(self, tmp_path: Path, tls: MemberTls, members: tuple[str, ...]) -> None:
        self.view = ClusterView("b1", 1, fenced=False)
        for node in members:
            self.view.members[node] = Member(node, "127.0.0.1:1", "http://127.0.0.1:1", "https://127.0.0.1:1")
        self.store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        self.tls = tls
        self.sock = bind_members_endpoint("127.0.0.1", 0)
        self.url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        self.seen: list[str | None] = []
        self.refused: list[str] = []
        """The reasons of requests refused for their connection's certificate."""
        self.routes: list[Callable[[web.Application], None]] = []
        """Routes served beside ``/who``."""

    async def __aenter__(self) -> Endpoint:
        self.store.open()

        async def who(request: web.Request) -> web.Response:
            self.seen.append(access_of(request).member)
            return web.Response(text=str(access_of(request).member))

        def route(app: web.Application) -> None:
            app.router.add_get("/who", who)

        self.routes.insert(0, route)
        self.runner = await serve_members_endpoint(
            self.sock,
            self.store,
            self.view,
            self.tls,
            MemberListenConfig(port=0),
            self.routes,
            None,
            self.refused.append,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()
        self.store.close()


async def _get(clients: MemberClients, node: str, url: str, headers: dict | None = None) -> tuple[int, str]:
    async with clients.session(node).get(url + "/who", headers=headers or {}) as answer:
        return answer.status, await answer.text()


def test_only_current_members_get_in_each_as_the_node_its_certificate_names(tmp_path: Path) -> None:
    pki = LocalPki(tmp_path / "pki")
    other_pki = LocalPki(tmp_path / "other")

    async def scenario() -> None:
        async with Endpoint(tmp_path, tls_of(pki, "b1"), members=("b1", "b2", "b3")) as endpoint:
            b2 = MemberClients("b2", tls_of(pki, "b2"))
            assert await _get(b2, "b1", endpoint.url) == (200, "b2")
            # b3 with a certificate naming b3, claiming to be b2: refused, and the connection closed
            b3 = MemberClients("b3", tls_of(pki, "b3"))
            status, body = await _get(b3, "b1", endpoint.url, {NODE_HEADER: "b2"})
            assert status == 403 and "names b3, the request claims b2" in body
            # a certificate of the cluster CA for a node that is not a member now
            stranger = MemberClients("b9", tls_of(pki, "b9"))
            status, body = await _get(stranger, "b1", endpoint.url)
            assert status == 403 and "b9 is not a member" in body
            # another CA's certificate naming a member: no TLS handshake, no request
            forged = MemberClients("b2", tls_of(other_pki, "b2"))
            with pytest.raises(aiohttp.ClientError):
                await _get(forged, "b1", endpoint.url)
            # no certificate at all, with the best token there is: no request
            async with aiohttp.ClientSession() as plain:
                context = ssl.create_default_context(cafile=str(pki.ca.cert))
                context.check_hostname = False
                with pytest.raises(aiohttp.ClientError):
                    async with plain.get(
                        endpoint.url + "/who", ssl=context, headers={"Authorization": "Bearer reader"}
                    ) as answer:
                        await answer.read()
            assert endpoint.seen == ["b2"]
            for clients in (b2, b3, stranger, forged):
                await clients.close()

    asyncio.run(scenario())


def test_a_member_sends_nothing_to_an_address_whose_certificate_names_another_node(tmp_path: Path) -> None:
    pki = LocalPki(tmp_path / "pki")

    async def scenario() -> None:
        # etcd says b3 lives at the address where b1 serves: b2's connection checks the certificate there
        async with Endpoint(tmp_path, tls_of(pki, "b1"), members=("b1", "b2", "b3")) as endpoint:
            b2 = MemberClients("b2", tls_of(pki, "b2"))
            with pytest.raises(NotThatMember, match="names b1, not b3: nothing sent"):
                await _get(b2, "b3", endpoint.url)
            with pytest.raises(aiohttp.ClientConnectionError, match="https:// only"):
                await _get(b2, "b1", endpoint.url.replace("https://", "http://"))
            assert await _get(b2, "b1", endpoint.url) == (200, "b2")
            assert endpoint.seen == ["b2"]  # the mismatched connection never made a request
            await b2.close()

    asyncio.run(scenario())


def test_a_reload_takes_a_new_certificate_and_ca_while_open_connections_keep_theirs(tmp_path: Path) -> None:
    old_pki, new_pki = LocalPki(tmp_path / "old"), LocalPki(tmp_path / "new")
    live = LocalPki(tmp_path / "live", "live")  # files the brokers read; the test swaps what they hold
    b1_files, b2_files = live.member("b1"), live.member("b2")
    bundle = tmp_path / "live" / "cluster-ca.pem"

    def install(pki: LocalPki, cas: list[LocalPki]) -> None:
        for node, files in (("b1", b1_files), ("b2", b2_files)):
            shutil.copy(pki.member(node).cert, files.cert)
            shutil.copy(pki.member(node).key, files.key)
        bundle.write_bytes(b"".join(ca.ca.cert.read_bytes() for ca in cas))

    def tls(node: str, files: PemPair) -> MemberTls:
        return MemberTls(MemberTlsConfig(str(files.cert), str(files.key), str(bundle)), node)

    async def scenario() -> None:
        install(old_pki, [old_pki])
        b1_tls, b2_tls = tls("b1", b1_files), tls("b2", b2_files)
        async with Endpoint(tmp_path, b1_tls, members=("b1", "b2")) as endpoint:
            b2 = MemberClients("b2", b2_tls)
            assert (await _get(b2, "b1", endpoint.url))[0] == 200
            # the rotation: both trust both CAs, then b2 moves to the new CA's certificate, then b1
            install(old_pki, [old_pki, new_pki])
            b1_tls.reload()
            b2_tls.reload()
            shutil.copy(new_pki.member("b2").cert, b2_files.cert)
            shutil.copy(new_pki.member("b2").key, b2_files.key)
            b2_tls.reload()
            await b2.close()
            assert (await _get(b2, "b1", endpoint.url))[0] == 200  # new certificate, old and new CA
            install(new_pki, [new_pki])
            b1_tls.reload()
            b2_tls.reload()
            await b2.close()
            assert (await _get(b2, "b1", endpoint.url))[0] == 200  # all new
            old_b2 = MemberClients("b2", tls_of(old_pki, "b2"))
            with pytest.raises(aiohttp.ClientError):  # the old CA is no longer trusted
                await _get(old_b2, "b1", endpoint.url)
            bundle.write_text("not a certificate")
            with pytest.raises(ConfigError):
                b1_tls.reload()  # a bad file keeps the files in force
            assert (await _get(b2, "b1", endpoint.url))[0] == 200
            for clients in (b2, old_b2):
                await clients.close()

    asyncio.run(scenario())


def test_a_request_on_a_kept_alive_connection_whose_ca_a_reload_took_out_is_refused(tmp_path: Path) -> None:
    """The last step of a cluster CA rotation: b1 reads its ``cafile`` with the new CA alone. b2, still on
    the old CA's certificate, had a connection kept alive from before: its next request is refused (403,
    ``certificate_untrusted``, the connection closed) where it was served; b3, of the new CA, is served."""
    old_pki, new_pki = LocalPki(tmp_path / "old"), LocalPki(tmp_path / "new")
    bundle = tmp_path / "cluster-cas.pem"
    bundle.write_bytes(old_pki.ca.cert.read_bytes() + new_pki.ca.cert.read_bytes())

    def tls(pki: LocalPki, node: str) -> MemberTls:
        files = pki.member(node)
        return MemberTls(MemberTlsConfig(str(files.cert), str(files.key), str(bundle)), node)

    async def scenario() -> None:
        b1_tls = tls(old_pki, "b1")
        async with Endpoint(tmp_path, b1_tls, members=("b1", "b2", "b3")) as endpoint:
            b2, b3 = MemberClients("b2", tls(old_pki, "b2")), MemberClients("b3", tls(new_pki, "b3"))
            assert await _get(b2, "b1", endpoint.url) == (200, "b2")
            assert await _get(b3, "b1", endpoint.url) == (200, "b3")
            bundle.write_bytes(new_pki.ca.cert.read_bytes())
            b1_tls.reload()
            status, body = await _get(b2, "b1", endpoint.url)  # on the connection kept alive
            assert status == 403 and "certificate_untrusted" in body and "CN=b2" in body, body
            assert await _get(b3, "b1", endpoint.url) == (200, "b3")
            assert endpoint.seen == ["b2", "b3", "b3"] and endpoint.refused == ["certificate_untrusted"]
            for clients in (b2, b3):
                await clients.close()

    asyncio.run(scenario())


class Quiet:
    """A peer receiver that is sent nothing here."""

    def forwarded(self, link: PeerLink, batch: int, messages: list) -> None:
        raise AssertionError("nothing is forwarded here")

    def unlogged(self, message: object) -> None:
        raise AssertionError("nothing is broadcast here")


def test_a_peer_link_is_closed_once_a_reload_no_longer_trusts_the_ca_its_member_connected_with(
    tmp_path: Path,
) -> None:
    """A peer link is one request held for weeks: a1, on the old CA, dialled b1 before b1's ``cafile`` lost
    that CA. The link is closed (where it stayed up), said and counted, and a1's next handshake is refused."""
    old_pki, new_pki = LocalPki(tmp_path / "old"), LocalPki(tmp_path / "new")
    bundle = tmp_path / "cluster-cas.pem"
    bundle.write_bytes(old_pki.ca.cert.read_bytes() + new_pki.ca.cert.read_bytes())
    b1_files, a1_files = old_pki.member("b1"), old_pki.member("a1")
    b1_tls = MemberTls(MemberTlsConfig(str(b1_files.cert), str(b1_files.key), str(bundle)), "b1")
    a1_tls = MemberTls(MemberTlsConfig(str(a1_files.cert), str(a1_files.key), str(bundle)), "a1")

    async def scenario() -> None:
        b1_links = PeerLinks("b1", None, Quiet())
        endpoint = Endpoint(tmp_path, b1_tls, members=("a1", "b1"))
        endpoint.routes.append(b1_links.add_routes)
        async with endpoint:
            a1_links = PeerLinks("a1", MemberClients("a1", a1_tls), Quiet())
            a1_links.update({"b1": endpoint.url})  # the smaller node id dials
            assert await until(lambda: b1_links.up("a1"))
            bundle.write_bytes(new_pki.ca.cert.read_bytes())
            b1_tls.reload()
            assert await until(lambda: not b1_links.up("a1"))
            assert endpoint.refused == ["certificate_untrusted"]
            a1 = MemberClients("a1", a1_tls)
            with pytest.raises(aiohttp.ClientError):  # its next handshake is refused
                await _get(a1, "b1", endpoint.url)
            assert not b1_links.up("a1")
            await a1.close()
            await a1_links.close()
            await b1_links.close()

    asyncio.run(scenario())


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def test_a_member_is_proven_by_a_link_until_its_record_changes_and_taken_for_dead_after_its_grace() -> None:
    now = [0.0]
    view = ClusterView("a", 1)
    view.members["a"] = Member("a", "h:1", "http://h:2", "https://h:3")
    view.members["b"] = Member("b", "h:1", "http://h:2", "https://h:4")
    view.members["evil"] = Member("evil", "x:1", "http://x:2", "https://x:3")
    proofs = MemberProofs(view, grace_s=6, clock=lambda: now[0])
    proofs.changed()
    woken: list[int] = []
    proofs.on_proof(lambda: woken.append(1))
    assert proofs.eligible() == {"a"} and proofs.alive() == {"a", "b", "evil"}  # within their grace
    now[0] = 7
    assert proofs.alive() == {"a", "b", "evil"}  # no link up at all: cut off, a takes nobody for dead
    now[0] = 0
    proofs.link_up("b")
    assert proofs.eligible() == {"a", "b"} and woken == [1]
    now[0] = 7
    assert proofs.alive() == {"a", "b"}  # evil never proved it is evil
    view.members["b"] = Member("b", "elsewhere:1", "http://h:2", "https://elsewhere:4")  # rewritten
    proofs.changed()
    assert proofs.eligible() == {"a"} and "b" in proofs.alive()  # must prove itself again, has its grace
    now[0] = 14
    assert proofs.alive() == {"a", "b", "evil"}  # a proves nothing of anyone now: it takes nobody for dead
    proofs.link_up("b")
    assert proofs.alive() == {"a", "b"}


def test_a_devices_certificate_of_the_cluster_ca_is_not_a_members(tmp_path: Path) -> None:
    """A device's certificate (``timestone pki issue client``: a CN, no ``timestone://node/`` URI) that the
    cluster's CA issued, presented on the members' endpoint, with a member's name in the header: refused
    (403, naming no node), and no request reaches a route."""
    pki = LocalPki(tmp_path / "pki")
    device = pki.client("b2")  # CN=b2, as a member's node id

    async def scenario() -> None:
        async with Endpoint(tmp_path, tls_of(pki, "b1"), members=("b1", "b2")) as endpoint:
            context = ssl.create_default_context(cafile=str(pki.ca.cert))
            context.check_hostname = False
            context.load_cert_chain(str(device.cert), str(device.key))
            async with (
                aiohttp.ClientSession() as session,
                session.get(endpoint.url + "/who", ssl=context, headers={NODE_HEADER: "b2"}) as answer,
            ):
                status, body = answer.status, await answer.text()
            assert status == 403 and "b2" not in endpoint.seen, body
            assert endpoint.seen == []

    asyncio.run(scenario())
