"""What the controller decides, as pure functions of the partition states and the live members (no I/O).

- ``initial_states``: replicas of new partitions, ``replication_factor`` of them (capped at the live members),
  replicas and leaderships spread evenly and deterministically; all in sync.
- ``plan``: the changes one pass of the controller makes, at most one per partition, in three steps:
  1. **elections** for partitions whose leader is gone: a live in-sync replica (highest log end first, then
     fewest leaderships, then node id); none → offline (leader None, in-sync set kept so that a returning
     member of it can lead again), unless unclean election is on: then any live replica, and the change says
     ``unclean`` so that the controller logs it at ERROR. Dead members leave the in-sync set of every
     partition that still has a live leader (acks wait for every in-sync replica: a dead one would stall
     them), and then its replicas: a member that is not live leaves the replica list of every partition
     that has a live leader in the pass that finds it dead (offline partitions keep theirs).
  2. **filling**: a partition with fewer live replicas than the replication factor (capped at the live
     members) gets the live members holding the fewest replicas. Not while it is offline, nor in the pass
     that ends that: a copy given then would start empty with nothing to copy from, and the brokers given
     it would stop observing the partition (their subscribers' reads from an offset would find no log, and
     a copy filled later would route the past to them as news); the pass after its election fills it from
     the leader, as any other.
  3. **balancing** (preferred-leader moves): while a live member leads two partitions more than another that
     is in sync on one of them (and not behind it, when log ends are known), that partition's leadership
     moves to it. Partitions elected in the same pass stay with their new leader.
  4. **shrinking**: a partition with more live replicas than the factor (a reassignment in progress) whose
     in-sync set has more live members than the factor drops one replica: the one on the most loaded
     member. When that member leads the partition, its leadership first moves to another in-sync replica
     (an orderly leader change with the next epoch) and its copy is dropped in the next pass: were another
     copy dropped instead, the move would only swap two members' counts and start again, for ever. Its
     in-sync set keeps at least the factor (and ``min_insync_replicas``) members. Partitions whose leader
     changes in the same pass wait for the next one; step 3 never gives leadership to the copy about to go.
  5. **reassigning**: while a live member holds two replicas more than another, the least loaded member
     becomes an extra replica (replicas: the factor + 1) of a partition of the most loaded one that it does
     not hold; at most ``moves_at_once`` partitions are in that
     state at a time. Once the extra replica is
     in sync, step 3 may give it the partition's leadership and step 4 drops a replica of the most loaded
     member, so replicas return to the factor and counts even out within one of the fair share.
  The epoch of a partition is +1 exactly when its leader changes (to None included).

Each decision is written by compare-and-swap, so a plan computed from a stale view simply fails and is
recomputed from the fresh one.

``live`` members are those the controller takes for alive (registered, and not failing to prove who they
are); ``eligible`` ones (by default the same) are those that proved their node id to the controller: only
they are given a copy or a leadership. A member registered by a write to etcd alone, which cannot prove
that node id, so never gets anything, and is taken for dead once its time to prove it has passed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from broker_edge.placement import PartitionState

__all__ = [
    "MOVES_AT_ONCE",
    "REASSIGN",
    "SPREAD",
    "Change",
    "LogEnds",
    "balance_leaders",
    "drop_dead_replicas",
    "elect_leaders",
    "fill_replicas",
    "initial_states",
    "leader_counts",
    "needs_election",
    "plan",
    "reassign_replicas",
    "replica_counts",
    "shrink_replicas",
]

SPREAD = "leadership spread"
"""How the reason of a leadership move made to spread leadership starts."""

REASSIGN = "replica moving"
"""How the reason of a change made to move a replica to a less loaded member starts."""

MOVES_AT_ONCE = 4
"""Partitions given an extra replica at a time by default (a join does not copy every partition at once)."""

LogEnds = Mapping[str, Mapping[int, int]]
"""node_id → partition → log end (sum of the end offsets of its topics in that partition) of the members
that answered; a member absent here did not answer (it is still eligible, ranked last)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One partition's new state, what it was, and why."""

    before: PartitionState
    after: PartitionState
    reasons: tuple[str, ...]
    unclean: bool = False
    """The new leader was not in sync: acknowledged records may be lost (log it at ERROR)."""

    @property
    def spreads(self) -> bool:
        """Whether this change moves a live leader's leadership to spread leadership."""
        return any(reason.startswith(SPREAD) for reason in self.reasons)

    @property
    def reassigns(self) -> bool:
        """Whether this change adds or drops a replica to move replicas to a less loaded member."""
        return any(reason.startswith(REASSIGN) for reason in self.reasons)

    @property
    def partition(self) -> int:
        return self.after.partition


def initial_states(
    partitions: Iterable[int], members: Collection[str], replication_factor: int
) -> list[PartitionState]:
    """Epoch-0 states of ``partitions`` over ``members``, all replicas in sync. The replica sets are
    consecutive blocks of the members (sorted by id) laid end to end around the ring, so every member holds
    as many replicas as any other, give or take one; each block's leader is its member with the fewest
    leaderships so far, which spreads leadership the same way."""
    ordered = sorted(set(members))
    if not ordered:
        raise ValueError("members: at least one live member is needed to assign partitions")
    if replication_factor < 1:
        raise ValueError(f"replication_factor: must be >= 1, got {replication_factor}")
    count = min(replication_factor, len(ordered))
    led: Counter[str] = Counter()
    states = []
    for index, partition in enumerate(sorted(partitions)):
        block = [ordered[(index * count + i) % len(ordered)] for i in range(count)]
        leader = min(block, key=lambda node: (led[node], block.index(node)))
        led[leader] += 1
        replicas = (leader, *(node for node in block if node != leader))
        states.append(PartitionState(partition, leader, 0, replicas, replicas))
    return states


def leader_counts(states: Iterable[PartitionState], live: Collection[str]) -> Counter[str]:
    """Partitions led by each live member (every live member present, with 0 if it leads none)."""
    counts: Counter[str] = Counter(dict.fromkeys(live, 0))
    for state in states:
        if state.leader is not None and state.leader in counts:
            counts[state.leader] += 1
    return counts


def needs_election(states: Iterable[PartitionState], live: Collection[str]) -> list[int]:
    """Partitions whose leader is not a live member (offline ones included): the controller asks their
    candidates for their log ends before calling ``plan``."""
    return sorted(state.partition for state in states if state.leader is None or state.leader not in live)


def _rank(node: str, partition: int, log_ends: LogEnds, counts: Counter[str]) -> tuple[bool, int, int, str]:
    ends = log_ends.get(node)
    answered = ends is not None
    end = ends.get(partition, 0) if ends is not None else 0
    return (not answered, -end, counts[node], node)


def elect_leaders(
    states: Mapping[int, PartitionState],
    live: Collection[str],
    log_ends: LogEnds | None = None,
    unclean_election: bool = False,
    eligible: Collection[str] | None = None,
) -> dict[int, tuple[PartitionState, str, bool]]:
    """Step 1 of ``plan``: partition → (new state, reason, unclean) for every partition that changes.
    Only ``eligible`` members (default: every live one) are elected."""
    log_ends = log_ends or {}
    eligible = live if eligible is None else eligible
    counts = leader_counts(states.values(), live)
    result: dict[int, tuple[PartitionState, str, bool]] = {}
    for partition in sorted(states):
        state = states[partition]
        if state.leader is not None and state.leader in live:
            alive = tuple(node for node in state.isr if node in live)
            if alive != state.isr:
                gone = ", ".join(node for node in state.isr if node not in live)
                result[partition] = (replace(state, isr=alive), f"dead {gone} left the in-sync set", False)
            continue
        candidates = [node for node in state.isr if node in live and node in eligible]
        unclean = False
        if not candidates and unclean_election:
            candidates = [node for node in state.replicas if node in live and node in eligible]
            unclean = bool(candidates)
        if not candidates:
            if state.leader is not None:
                result[partition] = (
                    replace(state, leader=None),
                    f"leader {state.leader} gone and no live in-sync replica: offline",
                    False,
                )
            continue
        leader = min(candidates, key=lambda node: _rank(node, partition, log_ends, counts))
        counts[leader] += 1
        if unclean:
            isr: tuple[str, ...] = (leader,)
            reason = f"UNCLEAN election of {leader} (not in sync; acknowledged records may be lost)"
        else:
            isr = tuple(node for node in state.isr if node in live)
            before = state.leader if state.leader is not None else "none"
            reason = f"leader {before} gone: elected in-sync {leader}"
        result[partition] = (replace(state, leader=leader, isr=isr), reason, unclean)
    return result


def drop_dead_replicas(
    states: Mapping[int, PartitionState], live: Collection[str], offline: Collection[int] = ()
) -> dict[int, tuple[PartitionState, str]]:
    """Step 1b of ``plan``: partition → (new state, reason) for every partition with a live leader whose
    replicas name members that are not live (outside its in-sync set, which step 1 already took them out
    of): they leave its replicas at once. A member gone for good, or one a forged record named, holds no
    copy a live member could take. Offline partitions keep theirs (a returning member of them may lead),
    also in the pass that ends that (``offline``: they had no leader when it started)."""
    result: dict[int, tuple[PartitionState, str]] = {}
    for partition in sorted(states):
        state = states[partition]
        if state.leader is None or state.leader not in live or partition in offline:
            continue
        dead = [node for node in state.replicas if node not in live and node not in state.isr]
        if dead:
            kept = tuple(node for node in state.replicas if node not in dead)
            result[partition] = (replace(state, replicas=kept), f"dead {', '.join(dead)} left the replicas")
    return result


def fill_replicas(
    states: Mapping[int, PartitionState],
    live: Collection[str],
    replication_factor: int,
    offline: Collection[int] = (),
    eligible: Collection[str] | None = None,
) -> dict[int, tuple[PartitionState, str]]:
    """Step 2 of ``plan``: partition → (new state, reason) for every partition given new replicas (only
    ``eligible`` members, default every live one), but for those with no leader and those in ``offline``
    (they had none when the pass started)."""
    eligible = live if eligible is None else eligible
    target = min(replication_factor, len(live))
    load: Counter[str] = Counter(dict.fromkeys(live, 0))
    for state in states.values():
        for node in state.replicas:
            if node in load:
                load[node] += 1
    result: dict[int, tuple[PartitionState, str]] = {}
    for partition in sorted(states):
        state = states[partition]
        if state.leader is None or partition in offline:
            continue
        have = [node for node in state.replicas if node in live]
        if len(have) >= target:
            continue
        spare = sorted(
            (node for node in live if node not in state.replicas and node in eligible),
            key=lambda n: (load[n], n),
        )
        added = spare[: target - len(have)]
        if not added:
            continue
        for node in added:
            load[node] += 1
        kept = [node for node in state.replicas if node in live or node in state.isr]
        result[partition] = (
            replace(state, replicas=(*kept, *added)),
            f"replicas below {target}: added {', '.join(added)}",
        )
    return result


def replica_counts(states: Iterable[PartitionState], live: Collection[str]) -> Counter[str]:
    """Replicas held by each live member (every live member present, with 0 if it holds none)."""
    counts: Counter[str] = Counter(dict.fromkeys(live, 0))
    for state in states:
        for node in state.replicas:
            if node in counts:
                counts[node] += 1
    return counts


def _drops(
    states: Mapping[int, PartitionState],
    live: Collection[str],
    replication_factor: int,
    min_insync_replicas: int = 1,
    keep: Collection[int] = (),
) -> dict[int, str]:
    """partition → the replica step 4 drops from it: for every partition with a surplus replica that can
    be dropped safely (its leader is live, more of its live replicas are in sync than the factor needs),
    the copy on the most loaded member; among equals not the leader's, then not the last added one. The
    leader's copy is the one only when its member holds strictly more than every other copy's. Partitions
    in ``keep`` are left out (and do not count as dropped for the loads of the next ones)."""
    target = min(replication_factor, len(live))
    load = replica_counts(states.values(), live)
    surplus = []
    for partition in sorted(states):
        state = states[partition]
        if partition in keep or state.leader is None or state.leader not in live:
            continue
        have = [node for node in state.replicas if node in live]
        in_sync = [node for node in state.isr if node in live]
        if len(have) > target and len(in_sync) > max(target, min_insync_replicas):
            surplus.append((partition, state, have))

    # among equally loaded members, one leading other such partitions first: its copies there can only go
    # after a leadership change, so it gives up one here instead
    leading = Counter(state.leader for _, state, _ in surplus)

    def most_loaded(state: PartitionState, have: list[str]) -> str:
        order = {node: index for index, node in enumerate(state.replicas)}
        return max(have, key=lambda n: (load[n], n != state.leader, leading[n], -order[n], n))

    result: dict[int, str] = {}
    # first the partitions whose most loaded copy is not the leader's, then the others with the loads
    # those drops leave (fewer leadership changes: a leader's copy often is no longer the most loaded)
    for leaders_too in (False, True):
        for partition, state, have in surplus:
            if partition in result:
                continue
            victim = most_loaded(state, have)
            if victim == state.leader and not leaders_too:
                continue
            load[victim] -= 1
            result[partition] = victim
    return dict(sorted(result.items()))


def _behind(log_ends: LogEnds, node: str, leader: str, partition: int) -> bool:
    """Whether ``node``'s known log end of ``partition`` is behind ``leader``'s (unknown: not behind)."""
    mine, theirs = log_ends.get(node), log_ends.get(leader)
    if mine is None or theirs is None:
        return False
    return mine.get(partition, 0) < theirs.get(partition, 0)


def shrink_replicas(
    states: Mapping[int, PartitionState],
    live: Collection[str],
    replication_factor: int,
    min_insync_replicas: int = 1,
    keep: Collection[int] = (),
    log_ends: LogEnds | None = None,
    eligible: Collection[str] | None = None,
) -> dict[int, tuple[PartitionState, str]]:
    """Step 4 of ``plan``: partition → (new state, reason) for every partition with a surplus replica that
    can be dropped safely: its leader is live, more of its live replicas are in sync than the factor needs,
    and the dropped one is on the most loaded member (among equals, not the leader, then not the last
    added). When that member leads the partition, its leadership first goes to the in-sync replica leading
    fewest partitions that is not behind it (an orderly leader change: the epoch rises, every acknowledged
    record is on every in-sync replica); its copy is dropped in a later pass, once it no longer leads.
    Without such a replica nothing changes. Partitions in ``keep`` (their leader changes in this pass) are
    left for the next pass."""
    log_ends = log_ends or {}
    eligible = live if eligible is None else eligible
    target = min(replication_factor, len(live))
    counts = leader_counts(states.values(), live)
    result: dict[int, tuple[PartitionState, str]] = {}
    for partition, victim in _drops(states, live, replication_factor, min_insync_replicas, keep).items():
        state = states[partition]
        if victim == state.leader:
            heirs = [
                node
                for node in state.isr
                if node in eligible and node != victim and not _behind(log_ends, node, victim, partition)
            ]
            if not heirs:
                continue
            heir = min(heirs, key=lambda node: (counts[node], node))
            counts[victim] -= 1
            counts[heir] += 1
            result[partition] = (
                replace(state, leader=heir),
                f"{REASSIGN}: leadership {victim} to {heir} before {victim}'s copy is dropped",
            )
            continue
        after = replace(
            state,
            replicas=tuple(n for n in state.replicas if n != victim),
            isr=tuple(n for n in state.isr if n != victim),
        )
        result[partition] = (after, f"{REASSIGN}: dropped {victim} (replicas back to {target})")
    return result


def reassign_replicas(
    states: Mapping[int, PartitionState],
    live: Collection[str],
    replication_factor: int,
    moves_at_once: int = MOVES_AT_ONCE,
    keep: Collection[int] = (),
    min_insync_replicas: int = 1,
    eligible: Collection[str] | None = None,
) -> dict[int, tuple[PartitionState, str]]:
    """Step 5 of ``plan``: partition → (new state, reason) for every partition given an extra replica on a
    less loaded member, while a live member holds two replicas more than another. Only partitions with a
    live leader and exactly the factor's live replicas, all of them in sync, are chosen (lowest number
    first), never one in ``keep``, and at most ``moves_at_once`` partitions have an extra replica at a time
    (those already moving count). A copy that step 4 is about to drop (its leadership just handed over) no
    longer counts for its member."""
    if moves_at_once < 1:
        raise ValueError(f"moves_at_once: must be >= 1, got {moves_at_once}")
    target = min(replication_factor, len(live))
    load = replica_counts(states.values(), live)
    load.subtract(_drops(states, live, replication_factor, min_insync_replicas).values())

    def live_replicas(state: PartitionState) -> list[str]:
        return [node for node in state.replicas if node in live]

    budget = moves_at_once - sum(1 for s in states.values() if len(live_replicas(s)) > target)
    result: dict[int, tuple[PartitionState, str]] = {}
    receivers = [node for node in load if eligible is None or node in eligible]
    while budget > 0 and receivers:
        receiver = min(receivers, key=lambda node: (load[node], node))
        chosen: tuple[int, str] | None = None
        for donor in sorted(load, key=lambda node: (-load[node], node)):
            if load[donor] - load[receiver] < 2:
                break
            for partition in sorted(states):
                state = states[partition]
                have = live_replicas(state)
                if (
                    partition in keep
                    or partition in result
                    or donor not in state.replicas
                    or receiver in state.replicas
                    or state.leader is None
                    or state.leader not in live
                    or len(have) != target
                    or not set(have) <= set(state.isr)
                ):
                    continue
                chosen = (partition, donor)
                break
            if chosen is not None:
                break
        if chosen is None:
            break
        partition, donor = chosen
        state = states[partition]
        load[receiver] += 1
        budget -= 1
        result[partition] = (
            replace(state, replicas=(*state.replicas, receiver)),
            f"{REASSIGN}: added {receiver} (from {donor}, holding {load[donor]} replicas)",
        )
    return result


def balance_leaders(
    states: Mapping[int, PartitionState],
    live: Collection[str],
    log_ends: LogEnds | None = None,
    keep: Collection[int] = (),
    replication_factor: int | None = None,
    min_insync_replicas: int = 1,
    eligible: Collection[str] | None = None,
) -> dict[int, tuple[PartitionState, str]]:
    """Step 3 of ``plan``: partition → (new state, reason) for the leadership moves that leave every live
    member within one leadership of every other one it could take over from. Leadership moves only to an
    in-sync replica, never to one whose known log end is behind the leader's (it would make the leader
    truncate records it holds), nor to the copy step 4 is about to drop from a partition with a surplus
    replica (given ``replication_factor``: it would hand the leadership straight back), and partitions in
    ``keep`` (just elected) stay where they are."""
    log_ends = log_ends or {}
    eligible = live if eligible is None else eligible
    current = dict(states)
    counts = leader_counts(current.values(), live)
    result: dict[int, tuple[PartitionState, str]] = {}
    dropped = (
        _drops(states, live, replication_factor, min_insync_replicas)
        if replication_factor is not None
        else {}
    )

    def behind(node: str, leader: str, partition: int) -> bool:
        return _behind(log_ends, node, leader, partition)

    moved = True
    while moved:
        moved = False
        # the most loaded leader first; among its partitions the lowest number; to the least loaded in sync
        for source in sorted(counts, key=lambda node: (-counts[node], node)):
            for partition in sorted(p for p, s in current.items() if s.leader == source and p not in keep):
                state = current[partition]
                targets = [
                    n
                    for n in state.isr
                    if n in live
                    and n in eligible
                    and counts[n] + 1 < counts[source]
                    and not behind(n, source, partition)
                    and dropped.get(partition) != n
                ]
                if not targets:
                    continue
                target = min(targets, key=lambda node: (counts[node], node))
                current[partition] = replace(state, leader=target)
                counts[source] -= 1
                counts[target] += 1
                result[partition] = (current[partition], f"{SPREAD}: {source} to {target}")
                moved = True
                break
            if moved:
                break
    return result


def plan(
    states: Mapping[int, PartitionState],
    live: Collection[str],
    replication_factor: int,
    log_ends: LogEnds | None = None,
    unclean_election: bool = False,
    min_insync_replicas: int = 1,
    moves_at_once: int = MOVES_AT_ONCE,
    eligible: Collection[str] | None = None,
) -> list[Change]:
    """Every change of one controller pass (elections, replica filling, leadership spreading, then the
    shrinking and reassigning that move replicas to less loaded members), merged into at most one change
    per partition, in partition order. ``log_ends`` ranks election candidates and keeps leadership from
    moving to a replica that is behind."""
    live_set = frozenset(live)
    fit = live_set if eligible is None else live_set & frozenset(eligible)
    working = dict(states)
    reasons: dict[int, list[str]] = {}
    unclean: set[int] = set()

    def apply(partition: int, state: PartitionState, reason: str) -> None:
        working[partition] = state
        reasons.setdefault(partition, []).append(reason)

    elected = set()
    for partition, (state, reason, was_unclean) in elect_leaders(
        working, live_set, log_ends, unclean_election, fit
    ).items():
        apply(partition, state, reason)
        if state.leader != states[partition].leader:
            elected.add(partition)
        if was_unclean:
            unclean.add(partition)
    offline = [partition for partition, state in states.items() if state.leader is None]
    for partition, (state, reason) in drop_dead_replicas(working, live_set, offline).items():
        apply(partition, state, reason)
    for partition, (state, reason) in fill_replicas(
        working, live_set, replication_factor, offline, fit
    ).items():
        apply(partition, state, reason)
    for partition, (state, reason) in balance_leaders(
        working, live_set, log_ends, elected, replication_factor, min_insync_replicas, fit
    ).items():
        apply(partition, state, reason)
    led = {p for p in working if working[p].leader != states[p].leader}
    shrunk = shrink_replicas(working, live_set, replication_factor, min_insync_replicas, led, log_ends, fit)
    for partition, (state, reason) in shrunk.items():
        apply(partition, state, reason)
    for partition, (state, reason) in reassign_replicas(
        working, live_set, replication_factor, moves_at_once, reasons.keys(), min_insync_replicas, fit
    ).items():
        apply(partition, state, reason)

    changes = []
    for partition in sorted(reasons):
        before = states[partition]
        after = working[partition]
        epoch = before.epoch + 1 if after.leader != before.leader else before.epoch
        after = replace(after, epoch=epoch)
        if after != before:
            changes.append(Change(before, after, tuple(reasons[partition]), partition in unclean))
    return changes
