"""A job's table maintenance on a schedule, in a background thread of its own.

The job calls :meth:`MaintenanceScheduler.poke` after each micro-batch (the telemetry job) or tick (the
actions job); when a compaction or a vacuum is due and none is running, one pass starts in the background
and the caller goes on at once. Maintenance never changes rows, so it takes no part in the batches'
exactly-once bookkeeping: a pass that fails, or a job that dies during one, leaves the tables as they were
or compacted, and the next pass tries again. Its commits may race the job's: a compaction that loses gives
up until the next pass, a merge that loses retries (:mod:`sinks.delta_rs`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from sinks.maintenance import Upkeep, maintenance_pass
from sinks.store import TableStore

from .config import MaintenanceConfig

log = logging.getLogger(__name__)


class MaintenanceScheduler:
    """Compacts ``tables`` every ``compact_interval_s`` and vacuums them (and tidies their logs) every
    ``vacuum_interval_s``; the first pass also sets the retention properties. ``clock`` is monotonic
    seconds (tests pass their own)."""

    def __init__(
        self,
        store: TableStore,
        tables: Sequence[str],
        config: MaintenanceConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.tables = list(tables)
        self.config = config
        self.policy = config.policy()
        self.clock = clock
        #: what the latest passes did, for logs, tests and benchmarks
        self.upkeep: deque[Upkeep] = deque(maxlen=1000)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="table-maintenance")
        self._running: Future[list[Upkeep]] | None = None
        started = clock()
        self._compacted_at = started
        self._vacuumed_at = started
        self._retention_set = False

    def poke(self) -> Future[list[Upkeep]] | None:
        """Start a pass in the background if one is due and none runs; the pass started, if any."""
        if not self.config.enabled or (self._running is not None and not self._running.done()):
            return None
        now = self.clock()
        vacuum = now - self._vacuumed_at >= self.config.vacuum_interval_s
        compact = vacuum or now - self._compacted_at >= self.config.compact_interval_s
        if not (compact or not self._retention_set):
            return None
        if compact:
            self._compacted_at = now
        if vacuum:
            self._vacuumed_at = now
        self._running = self._thread.submit(self._pass, compact, vacuum)
        return self._running

    def run_now(self, vacuum: bool = True) -> list[Upkeep]:
        """One whole pass in the caller's thread (a job stopping, a command); what it did."""
        self.wait()
        return self._pass(compact=True, vacuum=vacuum)

    def wait(self) -> None:
        """Wait for the pass in flight, if any."""
        running = self._running
        if running is not None:
            running.result()

    def close(self) -> None:
        """Let the pass in flight finish, then stop the thread."""
        self._thread.shutdown(wait=True)

    def _pass(self, compact: bool, vacuum: bool) -> list[Upkeep]:
        retention = not self._retention_set
        done = maintenance_pass(
            self.store, self.tables, self.policy, retention=retention, compact=compact, vacuum=vacuum
        )
        if retention:
            self._retention_set = not any(u.error for u in done if u.operation == "retention")
        self.upkeep.extend(done)
        worked = [u for u in done if u.count]
        if worked:
            log.info("table maintenance: %s", ", ".join(f"{u.table} {u.operation} {u.count}" for u in worked))
        return done
