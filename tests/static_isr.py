"""The ISR changer of a cluster whose partition states only the test and the leaders change: a
compare-and-swap on the partition's epoch, applied to every node's view (what the coordination side does
through etcd). Used by the leader's unit tests and by the in-process cluster of the end-to-end tests."""

from __future__ import annotations

import dataclasses

from broker_edge.cluster.view import ClusterView
from broker_edge.placement import PartitionState


class StaticIsr:
    """The ISR changer of a static cluster: CAS on the partition's epoch, applied to every view."""

    def __init__(self) -> None:
        self.views: list[ClusterView] = []
        self.changes: list[tuple[str, int, str]] = []
        self.expansions_allowed = True
        """False: no replica joins an ISR (a test holding a partition below ``min_insync_replicas``)."""

    async def shrink_isr(self, partition: int, expected_epoch: int, node: str) -> bool:
        return self._change(partition, expected_epoch, node, shrink=True)

    async def expand_isr(self, partition: int, expected_epoch: int, node: str) -> bool:
        return self._change(partition, expected_epoch, node, shrink=False)

    def _change(self, partition: int, expected_epoch: int, node: str, shrink: bool) -> bool:
        state = self.views[0].states[partition]
        if state.epoch != expected_epoch or (node in state.isr) != shrink:
            return False
        if not shrink and not self.expansions_allowed:
            return False
        isr = tuple(m for m in state.isr if m != node) if shrink else (*state.isr, node)
        self.changes.append(("shrink" if shrink else "expand", partition, node))
        self.set(dataclasses.replace(state, isr=isr))
        return True

    def set(self, state: PartitionState) -> None:
        """Make `state` the partition's state in every view (as an etcd watch would deliver it)."""
        for view in self.views:
            view.states[state.partition] = state
        for view in self.views:
            view.changed()
