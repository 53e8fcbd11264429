"""When a fenced member sends its MQTT clients to the other members.

A member that cannot prove its etcd lease alive is fenced (``coordination.membership``): it acknowledges
nothing and leads nothing. Its clients are sent elsewhere once the fence is more than a blip: at once when
etcd has answered that the lease is gone (the others take its partitions over), otherwise once it has been
fenced for ``cluster.fenced_clients_hold_ms`` without proving the lease again. etcd slow or restarting
fences every member at once: sending clients away at the first moment would send each to a member as
fenced as this one, and every device of the cluster would reconnect for a pause of etcd's. A member cut
off from etcd alone has its clients moved a hold after its fence, about when the others have taken its
partitions over (its lease ended a fence margin after the fence).

A CONNECT reaching a fenced member follows the same rule (``ClusterSessions``): it waits while the fence
may still lift and is sent to a live member once this member sends its clients away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker_edge.cluster.coordination.membership import Membership
    from broker_edge.cluster.view import ClusterView

__all__ = ["FencedClients"]


class FencedClients:
    """Decides when this fenced member sends its clients away, and does it once per fence (``move(why)``).

    ``membership`` is None on a member whose view is given (no etcd): a fence there is taken as final."""

    def __init__(
        self,
        view: ClusterView,
        membership: Membership | None,
        hold_s: float,
        move: Callable[[str], None],
    ) -> None:
        self.view = view
        self.membership = membership
        self.hold_s = hold_s
        self.move = move
        self._fenced = False
        self._held = False
        """The current fence has lasted ``hold_s``."""
        self._moved = False
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None

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
        if not self._moved and self.sends_clients_away():
            self._moved = True
            self._cancel_timer()
            why = (
                "etcd answered that its lease is gone"
                if self.lease_lost()
                else f"its lease not proven for fenced_clients_hold_ms ({self.hold_s:g} s) after the fence"
            )
            self.move(why)

    def close(self) -> None:
        """Nothing moves from now on (the node is stopping)."""
        self._closed = True
        self._cancel_timer()

    def _hold_over(self) -> None:
        self._timer = None
        self._held = True
        self.view_changed()

    def _reset(self) -> None:
        self._cancel_timer()
        self._fenced = self._held = self._moved = False

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
