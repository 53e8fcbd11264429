"""One memory budget for everything the broker's HTTP endpoints hold: request bodies and answers.

Every endpoint (the readers' offsets API, the members' endpoint of a cluster, the admin endpoint) reads
request bodies and builds answers in memory: a replica fetch or a records fetch of up to 64 MiB, a
``/v1/fetch`` body, ``/metrics``. Each alone is bounded; together they were not (a dozen large fetches
held the better part of a gigabyte). So every request takes its share from one ``MemoryBudget`` before it
reads or builds anything large (``Reservation.grow``), keeps it while its answer is written to a slow
client, and gives it back when done. A request that would pass the budget is refused with 503 and
``Retry-After`` (the client retries later), and nothing was read for it.

Members of a cluster have ``reserved_for_members`` of the budget that readers and the admin endpoint cannot
take: a reader fetching flat out slows other readers, never replication.

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
        self.refused = 0
        """Requests refused because the budget was spent."""

    def take(self, size: int, member: bool) -> bool:
        """Take ``size`` bytes for a request (False, and nothing taken, when it would not fit)."""
        if size <= 0:
            return True
        if self.held + size > self.limit_bytes:
            return False
        if not member:
            if self.held_by_readers + size > self.limit_bytes - self.reserved_for_members:
                return False
            self.held_by_readers += size
        self.held += size
        return True

    def force(self, size: int, member: bool) -> None:
        """Count ``size`` bytes already in memory (an answer a little larger than its share), fitting or
        not: the next requests are refused until it is given back."""
        if size > 0:
            self.held += size
            if not member:
                self.held_by_readers += size

    def give_back(self, size: int, member: bool) -> None:
        if size > 0:
            self.held -= size
            if not member:
                self.held_by_readers -= size


class Reservation:
    """One request's share of a budget: grows before each large read, settles on what its answer
    really holds, and is given back at the end of the request."""

    __slots__ = ("budget", "member", "size")

    def __init__(self, budget: MemoryBudget, member: bool) -> None:
        self.budget = budget
        self.member = member
        self.size = 0

    def grow(self, size: int) -> None:
        """Hold ``size`` more bytes; ``BudgetExhausted`` when the budget cannot take them."""
        if not self.budget.take(size, self.member):
            self.budget.refused += 1
            raise BudgetExhausted(f"the broker's HTTP memory budget cannot take {size} more bytes now")
        self.size += size

    def settle(self, size: int) -> None:
        """Hold exactly ``size`` bytes from now on (what the answer built really is)."""
        if size > self.size:
            self.budget.force(size - self.size, self.member)
        else:
            self.budget.give_back(self.size - size, self.member)
        self.size = size

    def release(self) -> None:
        self.budget.give_back(self.size, self.member)
        self.size = 0
