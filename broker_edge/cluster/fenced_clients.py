"""When a fenced member sends its MQTT clients to the other members.

A member that cannot prove its etcd lease alive is fenced (``coordination.membership``): it acknowledges
nothing and leads nothing. Its clients are sent elsewhere once the fence is more than a blip: at once when
etcd has answered that the lease is gone (the others take its partitions over), otherwise once it has been
fenced for ``cluster.fenced_clients_hold_ms`` without proving the lease again. etcd slow or restarting
fences every member at once: sending clients away at the first moment would send each to a member as
fenced as this one, and every device of the cluster would reconnect for a pause of etcd's. A member cut
off from etcd alone has its clients moved a hold after its fence, about when the others have taken its
partitions over (its lease ended a fence margin after the fence).

A fenced member's picture of the others is as old as its fence: etcd out of reach for every member fences
them all, and a member sending its clients to another would send them to one as fenced as itself, from
which they would bounce on. So once it is time to send them away, it asks each other member, on the
members' endpoint (``GET /v1/cluster``), whether it is a member now (not fenced), and sends clients only to
those that answer so (``members_now``), asking again every ``ASK_EVERY_S`` while it stays fenced. While
a member that answers so still counts this one among the members (its lease alive in etcd: etcd came back
from a restart, and this member has not proven its lease or read the cluster state again yet while the
others have), or others answer but none is a member (all fenced), its clients stay connected (it
acknowledges nothing meanwhile) and a CONNECT is refused server unavailable (v5 CONNACK 0x88, 3.1.1 return
code 3), so that the device backs off. When no other member in its view answers at all, this member cannot
tell whether it is the one cut off (the others healthy out of its reach) or the last one standing: it names
nobody, but disconnects its clients (v5 DISCONNECT 0x8B) so that each finds a member by itself. A view
without other members (etcd expired every lease at once and deleted every member's key) moves nobody.

A CONNECT reaching a fenced member follows the same rule (``ClusterSessions``): it waits while the fence
may still lift and is sent to a member that answered it is one (``referrals``) once this member sends its
clients away, or refused server unavailable when none did.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from broker_edge.cluster.cluster_info import CLUSTER_PATH

if TYPE_CHECKING:
    from broker_edge.cluster.coordination.membership import Membership
    from broker_edge.cluster.links.member_clients import MemberClients
    from broker_edge.cluster.view import ClusterView
    from broker_edge.placement import Member

__all__ = ["ASK_EVERY_S", "Answers", "FencedClients", "members_now"]

log = logging.getLogger("broker_edge.cluster.fenced_clients")

ASK_EVERY_S = 1.0
"""How often a fenced member sending its clients away asks the others again whether they are members."""
ASK_TIMEOUT_S = 1.0
"""How long a fenced member waits for another member's answer before taking it for no member."""


Answers = tuple[list[str], bool]
"""What the others answered: the MQTT addresses of those that are members now, and whether this member is
cut off (every other member it knows of, still in its view, left it without an answer)."""


async def members_now(view: ClusterView, clients: MemberClients) -> Answers:
    """The MQTT addresses (``host:port``) of the other members in ``view`` that answer, on their members'
    endpoint, that they are members now (not fenced), by node id, the others (fenced, out of reach, slow,
    of an earlier version without ``/v1/cluster`` there) left out; and whether this member is cut off. A view
    without other members is not (etcd that expired every lease at once deleted every member's key), nor
    is one whose members left it while they were asked. None at all while one of them still counts this
    member among the members."""
    others = [m for node, m in sorted(view.members.items()) if node != view.node_id and m.peer]
    answers = await asyncio.gather(*(_is_member(member, clients, view.node_id) for member in others))
    if any(said == STILL_LISTED for said in answers):
        return [], False  # its lease lives as etcd tells the others: it is slow to prove it, not gone
    members = [member.mqtt for member, said in zip(others, answers, strict=True) if said]
    unanswered = [member for member, said in zip(others, answers, strict=True) if said is None]
    cut_off = bool(others) and len(unanswered) == len(others)
    return members, cut_off and all(view.members.get(m.node_id) == m for m in unanswered)


STILL_LISTED = "still listed"
"""What ``_is_member`` says of a member that is one and still counts the asking member among the members."""


async def _is_member(member: Member, clients: MemberClients, asking: str) -> bool | str | None:
    """Whether ``member`` says it is a member now (``STILL_LISTED`` when it also counts ``asking`` among
    the members); None when it does not answer."""
    import aiohttp

    assert member.peer is not None
    url = member.peer.rstrip("/") + CLUSTER_PATH
    try:
        timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)
        async with clients.session(member.node_id).get(url, timeout=timeout) as answer:
            document = await answer.json() if answer.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    if not (
        isinstance(document, dict)
        and document.get("node_id") == member.node_id
        and document.get("fenced") is False
    ):
        return False
    listed = document.get("members")
    if isinstance(listed, list) and any(isinstance(m, dict) and m.get("node_id") == asking for m in listed):
        return STILL_LISTED
    return True


class FencedClients:
    """Decides when this fenced member sends its clients away, and does it once per fence
    (``move(why, referrals)``), to the members ``ask()`` found to be members now (none: when it found this
    member cut off).

    ``membership`` is None on a member whose view is given (no etcd): a fence there is taken as final."""

    def __init__(
        self,
        view: ClusterView,
        membership: Membership | None,
        hold_s: float,
        move: Callable[[str, list[str]], None],
        ask: Callable[[], Awaitable[Answers]],
    ) -> None:
        self.view = view
        self.membership = membership
        self.hold_s = hold_s
        self.move = move
        self.ask = ask
        self._fenced = False
        self._held = False
        """The current fence has lasted ``hold_s``."""
        self._moved = False
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._asking: asyncio.Task[None] | None = None
        self._referrals: list[str] | None = None
        """The members that answered, at the last asking of this fence, that they are members now."""

    def was_member(self) -> bool:
        """Whether this node has been a member (a node starting up is fenced until it registers: its
        clients have nowhere better to be)."""
        return self.membership is None or self.membership.proven_until > 0

    def lease_lost(self) -> bool:
        """Whether etcd has answered that this node's lease is gone (it is registering again)."""
        return self.membership is None or self.membership.lease_id is None

    def sends_clients_away(self) -> bool:
        """Whether this member, fenced, sends its clients (and new CONNECTs) to another member now."""
        if not self.view.fenced or not self.was_member():
            return False
        return self._held or self.lease_lost()

    def referrals(self) -> list[str] | None:
        """Where this member sends a CONNECT now: None while it does not send clients away or has not asked
        the others yet (the CONNECT waits), else the MQTT addresses of the members that answered they are
        members (empty: none did, the CONNECT is refused server unavailable)."""
        return self._referrals if self.sends_clients_away() else None

    def view_changed(self) -> None:
        """Follow the view: a fence starts the hold, its end resets it; clients move once it is time."""
        if self._closed:
            return
        if not self.view.fenced or not self.was_member():
            self._reset()
            return
        if not self._fenced:
            self._fenced = True
            if self.hold_s > 0:
                self._timer = asyncio.get_running_loop().call_later(self.hold_s, self._hold_over)
            else:
                self._held = True
        if self._asking is None and self.sends_clients_away():
            self._cancel_timer()
            why = (
                "etcd answered that its lease is gone"
                if self.lease_lost()
                else f"its lease not proven for fenced_clients_hold_ms ({self.hold_s:g} s) after the fence"
            )
            self._asking = asyncio.get_running_loop().create_task(self._ask_and_move(why))

    async def _ask_and_move(self, why: str) -> None:
        """Ask the others whether they are members, every ``ASK_EVERY_S`` while the fence lasts; move the
        clients to those that are, once."""
        told = False
        while True:
            referrals, cut_off = await self.ask()
            self._referrals = referrals
            if (referrals or cut_off) and not self._moved:
                self._moved = True
                self.move(why, referrals)
            elif not referrals and not self._moved and not told:
                told = True
                log.warning(
                    "fenced (%s): no other member answers that it is a member and no longer counts this"
                    " one among the members; clients stay here and new CONNECTs are refused (server"
                    " unavailable) until one does or the fence lifts",
                    why,
                )
            await asyncio.sleep(ASK_EVERY_S)

    def close(self) -> None:
        """Nothing moves from now on (the node is stopping)."""
        self._closed = True
        self._cancel_timer()
        self._stop_asking()

    def _hold_over(self) -> None:
        self._timer = None
        self._held = True
        self.view_changed()

    def _reset(self) -> None:
        self._cancel_timer()
        self._stop_asking()
        self._fenced = self._held = self._moved = False

    def _stop_asking(self) -> None:
        if self._asking is not None:
            self._asking.cancel()
            self._asking = None
        self._referrals = None

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
