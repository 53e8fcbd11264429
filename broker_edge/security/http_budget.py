"""One memory budget for everything the broker's HTTP endpoints hold: request bodies and answers.

Every endpoint (the readers' offsets API, the members' endpoint of a cluster, the admin endpoint) reads
request bodies and builds answers in memory: a replica fetch or a records fetch of up to 64 MiB, a
``/v1/fetch`` body, ``/metrics``. Each alone is bounded; together they were not (a dozen large fetches
held the better part of a gigabyte). So every request takes its share from one ``MemoryBudget`` before it
reads or builds anything large (``Reservation.grow``), keeps it while its answer is written to a slow
client, and gives it back when done. A request that would pass the budget is refused with 503 and
``Retry-After`` (the client retries later), and nothing was read for it.

Members of a cluster have ``reserved_for_members`` of the budget that readers and the admin endpoint cannot
take: a reader fetching flat out slows other readers, never replication. And one named reader (a token)
that already holds something may not pass half of what readers may hold: its answers fetched side by side
and taken slowly cannot keep every other reader out (its first request still takes what it needs).

Pure accounting here (no I/O, no aiohttp); ``http_guard.budget_middleware`` applies it to an app.
"""

from __future__ import annotations

__all__ = ["BudgetExhausted", "MemoryBudget", "Reservation"]


class BudgetExhausted(Exception):
    """The budget cannot take a request's share now (answer 503 with Retry-After)."""


class MemoryBudget:
    """Bytes held by requests, all endpoints together, at most ``limit_bytes``; readers (everyone but
    members) at most ``limit_bytes - reserved_for_members``."""

    def __init__(self, limit_bytes: int, reserved_for_members: int = 0) -> None:
        if limit_bytes < 1 or not 0 <= reserved_for_members < limit_bytes:
            raise ValueError(
                f"need 0 <= reserved_for_members < limit_bytes, got {reserved_for_members} and {limit_bytes}"
            )
        self.limit_bytes = limit_bytes
        self.reserved_for_members = reserved_for_members
        self.held = 0
        """Bytes held now by all requests."""
        self.held_by_readers = 0
        self.by_holder: dict[str, int] = {}
        """Bytes held now by each named reader that holds any."""
        self.refused = 0
        """Requests refused because the budget was spent."""

    def take(self, size: int, member: bool, holder: str | None = None) -> bool:
        """Take ``size`` bytes for a request (of the named reader ``holder``, when it has a name): False,
        and nothing taken, when it would not fit."""
        if size <= 0:
            return True
        if self.held + size > self.limit_bytes:
            return False
        if not member:
            readers_share = self.limit_bytes - self.reserved_for_members
            if self.held_by_readers + size > readers_share:
                return False
            held = self.by_holder.get(holder, 0) if holder is not None else 0
            if held and held + size > readers_share // 2:
                return False
            self.held_by_readers += size
        self.held += size
        self._count(holder, size, member)
        return True

    def force(self, size: int, member: bool, holder: str | None = None) -> None:
        """Count ``size`` bytes already in memory (an answer a little larger than its share), fitting or
        not: the next requests are refused until it is given back."""
        if size > 0:
            self.held += size
            if not member:
                self.held_by_readers += size
            self._count(holder, size, member)

    def give_back(self, size: int, member: bool, holder: str | None = None) -> None:
        if size > 0:
            self.held -= size
            if not member:
                self.held_by_readers -= size
            self._count(holder, -size, member)

    def _count(self, holder: str | None, size: int, member: bool) -> None:
        """Add ``size`` to what the named reader ``holder`` holds (forgotten once it holds nothing)."""
        if holder is None or member:
            return
        held = self.by_holder.get(holder, 0) + size
        if held > 0:
            self.by_holder[holder] = held
        else:
            self.by_holder.pop(holder, None)


class Reservation:
    """One request's share of a budget: grows before each large read, settles on what its answer
    really holds, and is given back at the end of the request."""

    __slots__ = ("budget", "holder", "member", "size")

    def __init__(self, budget: MemoryBudget, member: bool, holder: str | None = None) -> None:
        self.budget = budget
        self.member = member
        self.holder = holder
        """The named reader (a token's name) it is held for; None: a request without a name."""
        self.size = 0

    def grow(self, size: int) -> None:
        """Hold ``size`` more bytes; ``BudgetExhausted`` when the budget cannot take them."""
        if not self.budget.take(size, self.member, self.holder):
            self.budget.refused += 1
            raise BudgetExhausted(f"the broker's HTTP memory budget cannot take {size} more bytes now")
        self.size += size

    def settle(self, size: int) -> None:
        """Hold exactly ``size`` bytes from now on (what the answer built really is)."""
        if size > self.size:
            self.budget.force(size - self.size, self.member, self.holder)
        else:
            self.budget.give_back(self.size - size, self.member, self.holder)
        self.size = size

    def release(self) -> None:
        self.budget.give_back(self.size, self.member, self.holder)
        self.size = 0
