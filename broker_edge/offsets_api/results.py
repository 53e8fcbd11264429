"""What the offsets API's client hands its readers: one topic's fetch, a batch fetch and each topic's result,
a storage partition's extent and one read of it.

A log's state is a ``broker_edge.log_info.LogInfo``, the type the store reports. Nothing here imports the
storage engine, so that whatever reads the API (the Spark source on an executor, a peer broker, a test)
does not load it (a test holds the client to that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa

    from broker_edge.offsets_api.errors import OffsetsApiError

__all__ = ["BatchFetch", "Fetched", "PartitionExtent", "PartitionFetch", "RemovedPositions", "TopicResult"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Fetched(Generic[T]):
    """Records of one topic (an Arrow table or `Record`s) and where to continue."""

    data: T
    next_offset: int
    """The offset to ask for next (the requested one when nothing was returned)."""
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class TopicResult:
    """The outcome for one topic of a batch fetch: positions, or the error for that topic alone."""

    topic: str
    next_offset: int | None
    start_offset: int | None
    end_offset: int | None
    records: int
    error: OffsetsApiError | None


@dataclass(frozen=True, slots=True)
class BatchFetch:
    """The records of many topics in one table (`topic` column), and each topic's result."""

    table: pa.Table
    results: dict[str, TopicResult]
    store: str | None = None
    """The identity of the store that answered (None: a broker older than store identities)."""


@dataclass(frozen=True, slots=True)
class PartitionExtent:
    """One storage partition's entries `[start_position, end_position)` (every topic's, in log order)."""

    partition: int
    start_position: int
    end_position: int


@dataclass(frozen=True, slots=True)
class RemovedPositions:
    """What retention deleted of a partition's topics (`GET /v1/partitions/{p}/removed`)."""

    accounted_from: int
    """Positions deleted at or past it are accounted for by topic; below it, the broker cannot tell."""
    removed_below: dict[str, int]
    """Per topic that lost records past the position asked about: one past its newest deleted record."""

    def accounts_for(self, position: int) -> bool:
        """Whether every position deleted at or past `position` is accounted for."""
        return position >= self.accounted_from


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """Records of a partition's topics in log order (`topic` column) and where to continue."""

    table: pa.Table
    next_position: int
    start_position: int
    end_position: int
    lost: dict[str, int]
    """Per topic: records passed over because retention had moved the topic's start past them."""
    damaged: int
    """Entries passed over because they failed their checks on the broker."""
    removed: int
    """Positions passed over because retention deleted their segment."""
    store: str | None = None
    """The identity of the store that answered (None: a broker older than store identities)."""
