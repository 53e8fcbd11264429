"""The streaming-source API of the running pyspark, and how the sources plan batches where it is older.

Spark 4.2 gave Python streaming sources admission control and ``Trigger.AvailableNow``: Spark passes each
batch's start and a read limit to ``latestOffset(start, limit)``, asks ``getDefaultReadLimit()``, calls
``prepareForTriggerAvailableNow()`` and ``reportLatestOffset()``. Spark 4.0 and 4.1 (Databricks Runtime
17.3 LTS ships 4.0) have none of it: ``pyspark.sql.streaming.datasource`` does not exist, and Spark calls
``latestOffset()`` with no argument, before ``initialOffset()`` on a new query.

There the sources keep the batch start themselves, in the planner process Spark keeps per query
(:class:`BatchStarts`): a new query starts at its initial offset (computed once); then each batch starts where
the one before ended, known from the offsets the source returned and from ``partitions(start, end)``,
which Spark calls before anything else when a query restarts (for the batch it replays, or the committed
one with ``start == end``). The source applies its own read limit to that start, so ``maxRecordsPerTrigger``
(``maxVersionsPerTrigger``) still bounds the batches of a processing-time trigger. An ``availableNow`` run
degrades: Spark 4.0 fixes its end from one ``latestOffset()`` call, so with a limit the run reads one bounded
batch (the next run goes on from there), without one everything in one batch; a processing-time query over
the ``timestone`` source's ``endAtQueryStart`` reads the same batches as ``availableNow`` on Spark 4.2
(``pipelines.available_now``). :func:`note_spark_version` logs this once in the driver, and each query's
planner logs it once too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxFiles,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
else:
    try:
        from pyspark.sql.streaming.datasource import (
            ReadAllAvailable,
            ReadLimit,
            ReadMaxFiles,
            ReadMaxRows,
            SupportsTriggerAvailableNow,
        )
    except ImportError:  # Spark 4.0, 4.1: stand-ins that only the sources themselves use
        from abc import ABC, abstractmethod
        from dataclasses import dataclass

        class ReadLimit:
            """How much one batch may read (Spark 4.2's ``ReadLimit``)."""

        @dataclass
        class ReadAllAvailable(ReadLimit):
            """No bound."""

        @dataclass
        class ReadMaxRows(ReadLimit):
            max_rows: int

        @dataclass
        class ReadMaxFiles(ReadLimit):
            max_files: int

        class SupportsTriggerAvailableNow(ABC):
            @abstractmethod
            def prepareForTriggerAvailableNow(self) -> None: ...


__all__ = [
    "ADMISSION_CONTROL",
    "BatchStarts",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxFiles",
    "ReadMaxRows",
    "SupportsTriggerAvailableNow",
    "admission_control",
    "note_spark_version",
]

log = logging.getLogger(__name__)

FIRST_WITH_ADMISSION_CONTROL = (4, 2)
"""The first Spark whose Python streaming sources are given their batch start and a read limit."""


def admission_control(spark_version: str) -> bool:
    """Whether Spark ``spark_version`` (``4.0.0``, ``4.1.1``, ``4.3.0-SNAPSHOT``) passes the batch start and a
    read limit to Python streaming sources."""
    numbers = []
    for part in spark_version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        numbers.append(int(digits or 0))
    return tuple(numbers) >= FIRST_WITH_ADMISSION_CONTROL


def _installed_pyspark() -> str:
    from pyspark import __version__

    return __version__


ADMISSION_CONTROL = admission_control(_installed_pyspark())
"""Whether the installed pyspark has admission control for Python streaming sources."""

DEGRADED = (
    "Spark {version} gives Python streaming sources neither their batch start nor a read limit (Spark 4.2 "
    "does): the timestone and delta_cdf sources plan each batch from where the last one ended and apply "
    "maxRecordsPerTrigger and maxVersionsPerTrigger themselves; an availableNow run reads at most one "
    "such batch (all that is available when no limit is set), and the next run goes on from there; a "
    "processing-time query with the option endAtQueryStart=true reads what was there in bounded batches"
)

_noted: set[str] = set()


def note_spark_version(version: str) -> bool:
    """Log, once per process and Spark version, what the sources do differently on a Spark without
    admission control; returns whether this Spark has it."""
    supported = admission_control(version)
    if not supported and version not in _noted:
        _noted.add(version)
        log.warning(DEGRADED.format(version=version))
    return supported


class BatchStarts:
    """Where the next batch starts, for a Spark that does not pass it to ``latestOffset`` (4.0, 4.1).

    A reader calls :meth:`start` when ``latestOffset`` gets no start, and :meth:`ended` with every end offset
    it returns or is given by ``partitions``. On Spark 4.2+ only the end offsets are noted (cheap).
    """

    def __init__(self) -> None:
        self._next: dict | None = None

    def start(self, initial: Callable[[], dict]) -> dict:
        """The end of the last batch this process planned or was given, else the query's initial offset."""
        note_spark_version(_installed_pyspark())
        return self._next if self._next is not None else initial()

    def ended(self, end: dict) -> None:
        self._next = end
