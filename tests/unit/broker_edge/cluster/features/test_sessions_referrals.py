"""A fenced member sends CONNECTs elsewhere (``ClusterSessions.claim``): MQTT 5 clients to the members that
answered they are members now, in turn, each named in the CONNACK 0x9C's Server Reference; a 3.1.1 client,
which cannot be told where, takes no turn. With none answering so, every CONNECT is refused server
unavailable at once."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

from broker_edge.cluster.features.sessions import ClusterSessions
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.ports import SessionClaim
from broker_edge.placement import Member


class NoLinks:
    """Peer links that serve nothing: the claims below never reach another member."""

    def serve_requests(self, service: str, handler: object) -> None:
        pass


def fenced_member(referrals: list[str] | None = None) -> ClusterSessions:
    """Member ``b1`` of three, fenced after it was a member (its lease lapsed): every claim is refused;
    ``referrals``: the members that answered they are members (b2 and b3 by default)."""
    view = ClusterView("b1", 4)
    for node in ("b1", "b2", "b3"):
        view.members[node] = Member(
            node, f"127.0.0.1:{1880 + int(node[1])}", f"http://127.0.0.1:{9880 + int(node[1])}"
        )
    view.fenced = True
    cluster = SimpleNamespace(node_id="b1", session_save_interval_ms=1000, session_handover_timeout_ms=5000)
    answered = ["127.0.0.1:1882", "127.0.0.1:1883"] if referrals is None else referrals
    return ClusterSessions(
        cast(Any, None), cast(Any, None), view, cast(Any, NoLinks()), cast(Any, cluster), lambda: answered
    )


def claim(sessions: ClusterSessions, client_id: str, v5: bool) -> tuple[str | None, str | None]:
    async def claimed() -> tuple[str | None, str | None]:
        answer: asyncio.Future[tuple[str | None, str | None]] = asyncio.get_running_loop().create_future()
        request = SessionClaim(client_id, None, True, 0, None, 0, takes_reference=v5)
        sessions.claim(request, lambda refusal, reference: answer.set_result((refusal, reference)))
        return await answer

    return asyncio.run(claimed())


def test_mqtt_5_clients_are_sent_to_the_live_members_in_turn_and_a_3_1_1_client_takes_no_turn():
    sessions = fenced_member()
    first = claim(sessions, "v5-a", v5=True)
    v3 = claim(sessions, "v3", v5=False)
    second = claim(sessions, "v5-b", v5=True)
    assert v3 == ("use_another_server", None)
    assert first[0] == second[0] == "use_another_server"
    assert {first[1], second[1]} == {"127.0.0.1:1882", "127.0.0.1:1883"}, "one to each live member"


def test_with_no_member_answering_that_it_is_one_the_claim_is_refused_as_unavailable_at_once():
    """The others are as fenced as this one (etcd out of reach for all): no Server Reference to them, where
    the device would be refused again and sent on."""
    sessions = fenced_member(referrals=[])
    started = time.monotonic()
    assert claim(sessions, "v5", v5=True) == ("session_unavailable", None)
    assert time.monotonic() - started < 1.0  # not after session_handover_timeout_ms (5 s)
    assert claim(sessions, "v3", v5=False) == ("session_unavailable", None)
