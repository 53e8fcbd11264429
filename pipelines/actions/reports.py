"""The device status reports stream of the actions job, from separate brokers or from one cluster.

Separate brokers each hold their own reports: one ``timestone`` query reads all of them (``BrokerReports``).
A cluster holds every report on every replica at the same offset, so ``ClusterReports`` reads them once,
with the members as the source's ``bootstrapServers`` and offsets checkpointed by topic under the cluster
name ``cluster``: they stay valid whichever member serves them.

Each batch of the stream is worked on in Spark's tasks (``fold_batch``): each task parses its records'
reports, checks who sent them and folds them per (action, device), so that the driver receives one row per
pair a task read, not the reports (docs/ota.md, "Targets of any size").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from broker_edge.config.endpoints import BrokerEndpoint
from pipelines.actions.model import parse_reports
from pipelines.actions.report_scope import SHOWN
from pipelines.actions.states import Execution, StatusReport, apply_reports, queued
from pipelines.spark_session import stop_between_batches

__all__ = [
    "CLUSTER_BROKER_ID",
    "BrokerReports",
    "ClusterReports",
    "FoldedReports",
    "ReportFold",
    "ReportStream",
    "fold_batch",
]

CLUSTER_BROKER_ID = "cluster"
"""The cluster name a cluster's reports are checkpointed under, whichever member serves them."""

StartQuery = Callable[[Sequence[BrokerEndpoint]], StreamingQuery]
"""Starts the reports query over the given endpoints (their names are the checkpoint's broker ids)."""


class BrokerReports:
    """One query over every broker: each holds its own devices' reports. :meth:`start` starts it, again after
    a failure (the supervisor of the job calls it)."""

    def __init__(self, start: StartQuery, brokers: Sequence[BrokerEndpoint]) -> None:
        self._start = start
        self._brokers = list(brokers)
        self.query: StreamingQuery | None = None
        self._watched: StreamingQuery | None = None
        self._read_until = 0

    def read_until(self, now_ms: int, trigger_ms: int) -> int:
        """A time (epoch ms) before which every report the brokers took in has been handled, as far as the
        query running now says; 0 until it has caught up once (a query started again reads what came in
        while it was down first). Caught up: its last trigger found nothing new (then every report taken in
        before that trigger began, at most two trigger intervals ago, was handled), or its last batch read
        up to the latest offsets there were when it began."""
        query = self.query
        if query is not self._watched:
            self._watched, self._read_until = query, 0
        if query is None:
            return 0
        try:
            status, last = query.status, query.lastProgress
        except Exception:  # a query that stopped meanwhile: what was known stays known
            return self._read_until
        if last is None:  # no trigger has ended yet
            return self._read_until
        caught_up = _caught_up_at(last)
        if _idle(status):
            caught_up = max(caught_up or 0, now_ms - 2 * trigger_ms)
        self._read_until = max(self._read_until, caught_up or 0)
        return self._read_until

    def start(self) -> StreamingQuery:
        self.query = self._start(self._brokers)
        return self.query

    def running(self) -> bool:
        return self.query is not None and bool(self.query.isActive)

    def stop(self) -> None:
        if self.query is not None:
            stop_between_batches(self.query)


INITIAL_STATUS_MESSAGE = "Initializing StreamExecution"
"""The message of a batch's status before its trigger starts (Spark's initial one)."""


def _idle(status: Mapping[str, Any]) -> bool:
    """Whether a query's status says that its last trigger found nothing new and no trigger runs now.

    Neither active nor with data is not enough: Spark 4 keeps a status per batch, and the next batch's
    shows its initial one (neither active nor with data) from the moment it becomes the query's until its
    trigger starts, right after a batch that may not have read what came in meanwhile (a batch replayed
    after a restart reads only what its first run planned)."""
    return (
        not status.get("isTriggerActive")
        and not status.get("isDataAvailable")
        and status.get("message") != INITIAL_STATUS_MESSAGE
    )


def _caught_up_at(progress: Any) -> int | None:
    """When the batch of ``progress`` began (epoch ms), if it read up to the latest offsets of every source
    as they were then (sources that report them); else None."""
    try:
        sources = list(progress["sources"])
        ends = [(source["latestOffset"], source["endOffset"]) for source in sources]
        if not ends or not all(_reaches(latest, end) for latest, end in ends):
            return None
        return int(
            datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00")).timestamp() * 1000
        )
    except (KeyError, TypeError, ValueError):
        return None


def _reaches(latest: Any, end: Any) -> bool:
    """Whether a batch's ``end`` offsets reach the ``latest`` ones its source reported (either as JSON text).

    The ``timestone`` source reports the latest offsets as ``{broker: {log: end}}`` and ends a batch with
    more keys than those (its stores, listed filters, marks), so the two are never equal: each log the
    latest offsets name must be read up to there."""
    latest, end = _parsed(latest), _parsed(end)
    if latest is None:
        return False
    if latest == end:
        return True
    if not isinstance(latest, dict) or not isinstance(end, dict):
        return False
    for broker, logs in latest.items():
        read = end.get(broker)
        if not isinstance(logs, dict) or not isinstance(read, dict):
            return False
        for log, position in logs.items():
            reached = read.get(log)
            if not isinstance(reached, int) or not isinstance(position, int) or reached < position:
                return False
    return True


def _parsed(offsets: Any) -> Any:
    if isinstance(offsets, str):
        try:
            return json.loads(offsets)
        except ValueError:
            return offsets
    return offsets


class ClusterReports(BrokerReports):
    """One query over a whole cluster: the ``timestone`` source reads it through ``bootstrapServers``, finds
    each topic's replicas itself and reads a dead member's ranges from another replica, so the query
    outlives any one member."""


ReportStream = BrokerReports
"""Either kind: what the job holds."""


# A batch's reports, folded on the executors --------------------------------------------------------------

Key = tuple[str, str]
"""(action id, device id)."""

_REPORT_FIELDS = (
    "action_id string, device_id string, state string, seq long, ts long, details string, attempt int, "
    "received_at long"
)
_TALLY_FIELDS = "not_reports long, impostor_count long, impostors array<string>"
PARSED_SCHEMA = f"{_REPORT_FIELDS}, position long, {_TALLY_FIELDS}"
"""A batch's reports as the tasks parse them (each with its place in the batch, ``position``), and per task
one tally row (``action_id`` null) of the records that are not reports and the impostors."""
FOLDED_SCHEMA = (
    "action_id string, device_id string, state string, version long, report_seq long, status_details string, "
    f"queued_at long, updated_at long, started_at long, finished_at long, min_seq long, min_attempt int, "
    f"{_TALLY_FIELDS}"
)
"""What the driver receives: one row per (action, device) of each task, and the tallies of those that left
records out."""


@dataclass(frozen=True)
class ReportFold:
    """One (action, device)'s reports of a batch, folded on the executors as if each were news to its row:
    ``row`` is the execution they make of no row (``apply_reports(None, reports)``); ``min_seq`` and
    ``min_attempt`` (of those that say one) tell which rows they are all news to."""

    row: Execution
    min_seq: int
    min_attempt: int | None

    def covers(self, current: Execution | None) -> bool:
        """Whether :meth:`onto` gives what folding every report onto ``current`` gives: no row, an ended one
        (no report changes it), or one whose sequence and attempt every report is past."""
        if current is None or current.terminal:
            return True
        attempts_pass = self.min_attempt is None or self.min_attempt >= current.attempt
        return self.min_seq > current.report_seq and attempts_pass

    def onto(self, current: Execution | None) -> Execution | None:
        """``apply_reports(current, reports)`` for a ``current`` this fold covers: every report applies as it
        did onto no row (a row not ended takes any report a device sends), so the row takes the last one's
        state, times and details, one version per report applied, and its start if it had none."""
        if current is None:
            return self.row
        if current.terminal:
            return None
        row = self.row
        return replace(
            current,
            state=row.state,
            version=current.version + row.version,
            report_seq=row.report_seq,
            status_details=row.status_details,
            updated_at=row.updated_at,
            started_at=current.started_at if current.started_at is not None else row.started_at,
            finished_at=row.finished_at,
        )


def fold_reports(reports: list[StatusReport]) -> ReportFold:
    """The fold of one (action, device)'s reports (in the batch's order; at least one)."""
    row = apply_reports(None, reports)
    if row is None:  # every report starts a row of none: parse_report keeps device states and seq >= 1
        raise ValueError("reports that change no row")
    attempts = [r.attempt for r in reports if r.attempt is not None]
    return ReportFold(row, min(r.seq for r in reports), min(attempts) if attempts else None)


Expand = Callable[[set[Key]], dict[Key, list[StatusReport]]]
"""Every report of the batch of the given pairs, in the batch's order."""


@dataclass
class FoldedReports:
    """A reports batch as the driver receives it: one :class:`ReportFold` per (action, device), what the
    executors left out, and a way back to the reports of pairs whose fold does not cover their row."""

    by_key: dict[Key, ReportFold]
    expand: Expand
    refolded: set[Key] = field(default_factory=set)
    """Pairs whose reports several tasks read (a topic read in slices), folded again after a shuffle."""
    not_reports: int = 0
    impostor_count: int = 0
    impostors: list[str] = field(default_factory=list)
    """Up to ``SHOWN`` of them, ``"<client id> for <device id>"``."""
    received: int = 0
    """Rows the driver received: one per pair, and the tallies."""
    expanded: int = 0
    """Pairs whose reports were read one by one (a row some report was not news to)."""

    def fold(
        self, kept: Mapping[Key, ReportFold], rows: Mapping[str, Mapping[str, Execution]]
    ) -> dict[Key, Execution | None]:
        """Each kept pair's row after its reports: the fold onto its row where it covers it; else (a report
        the row has seen, a replayed batch, an earlier attempt's) every report of those pairs, read again in
        one query, folded onto the row as they come."""
        current = {key: rows.get(key[0], {}).get(key[1]) for key in kept}
        stale = {key for key, fold in kept.items() if not fold.covers(current[key])}
        full = self.expand(stale) if stale else {}
        self.expanded += len(stale)
        return {
            key: apply_reports(current[key], full.get(key, [])) if key in stale else fold.onto(current[key])
            for key, fold in kept.items()
        }


class ParseReports:
    """What each task runs on its records (pickled to the executors): their reports as rows, each with its
    place in the batch, and one tally row of the records left out (``model.parse_reports``)."""

    def __init__(self, identity: str) -> None:
        self.identity = identity

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        order = (context.partitionId() if context is not None else 0) << 33  # monotonically_increasing_id's
        schema = _arrow_schema(PARSED_SCHEMA)
        not_reports = impostor_count = 0
        named: list[str] = []
        for batch in batches:
            impostors: list[str] = []
            reports = parse_reports(pa.Table.from_batches([batch]), self.identity, impostors)
            not_reports += batch.num_rows - len(reports) - len(impostors)
            impostor_count += len(impostors)
            named += impostors[: SHOWN - len(named)]
            rows = [{**_report_row(r), "position": order + i} for i, r in enumerate(reports)]
            order += len(reports)
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema)
        tally = {"not_reports": not_reports, "impostor_count": impostor_count, "impostors": named}
        yield pa.RecordBatch.from_pylist([tally], schema)


class FoldReports(ParseReports):
    """What each task runs on its records (pickled to the executors): :class:`ParseReports`, then
    :func:`fold_parsed`."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return fold_parsed(super().__call__(batches))


def fold_parsed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A task's parsed reports (``PARSED_SCHEMA``) as one row per pair (its fold), and one tally row of
    what its records left out, if they left anything out."""
    by_key: dict[Key, list[dict]] = {}
    not_reports = impostor_count = 0
    named: list[str] = []
    for batch in batches:
        for row in batch.to_pylist():
            if row["action_id"] is None:
                not_reports += row["not_reports"]
                impostor_count += row["impostor_count"]
                named += row["impostors"][: SHOWN - len(named)]
            else:
                by_key.setdefault((row["action_id"], row["device_id"]), []).append(row)
    folded = []
    for rows in by_key.values():
        rows.sort(key=lambda row: row["position"])
        fold = fold_reports([_status_report(row) for row in rows])
        row_fields = {name: getattr(fold.row, name) for name in _FOLDED_ROW_FIELDS}
        folded.append({**row_fields, "min_seq": fold.min_seq, "min_attempt": fold.min_attempt})
    tally = {"not_reports": not_reports, "impostor_count": impostor_count, "impostors": named}
    left_out = [tally] if not_reports or impostor_count else []
    yield pa.RecordBatch.from_pylist([*folded, *left_out], _arrow_schema(FOLDED_SCHEMA))


_FOLDED_ROW_FIELDS = (
    "action_id",
    "device_id",
    "state",
    "version",
    "report_seq",
    "status_details",
    "queued_at",
    "updated_at",
    "started_at",
    "finished_at",
)


def fold_batch(batch: DataFrame, identity: str) -> FoldedReports:
    """A reports batch (the ``timestone`` source's records) parsed, checked and folded per (action,
    device) in the tasks that read it, without a shuffle (a device's reports are on one topic, which one
    task reads unless the topic is read in slices): the driver receives one row per pair and task and a
    tally per task that left records out, never a report. The pairs several tasks read are folded again,
    their reports shuffled by pair (one more query, those pairs only). Only the pairs
    :meth:`FoldedReports.fold` finds their fold does not cover are read again, in one query."""
    folded = batch.mapInArrow(FoldReports(identity), FOLDED_SCHEMA)
    parsed = batch.mapInArrow(ParseReports(identity), PARSED_SCHEMA)
    result = FoldedReports({}, lambda keys: _reports_of(parsed, keys))
    split = _take_folds(result, folded)
    if split:
        refolds = _of_pairs(parsed, split).repartition("action_id", "device_id")
        _take_folds(result, refolds.mapInArrow(fold_parsed, FOLDED_SCHEMA))
        result.refolded = split
    return result


def _take_folds(result: FoldedReports, folded: DataFrame) -> set[Key]:
    """Add the rows of ``folded`` to ``result``; returns the pairs of which it held more than one fold."""
    rows = folded.toArrow().to_pylist()
    result.received += len(rows)
    seen: set[Key] = set()
    split: set[Key] = set()
    for row in rows:
        if row["action_id"] is None:
            result.not_reports += row["not_reports"]
            result.impostor_count += row["impostor_count"]
            result.impostors += row["impostors"][: SHOWN - len(result.impostors)]
            continue
        fields = {name: row[name] for name in _FOLDED_ROW_FIELDS}
        execution = replace(queued(row["action_id"], row["device_id"], row["queued_at"]), **fields)
        key = (row["action_id"], row["device_id"])
        if key in seen:  # read by two tasks: neither fold is the pair's
            split.add(key)
        seen.add(key)
        result.by_key[key] = ReportFold(execution, row["min_seq"], row["min_attempt"])
    return split


def _reports_of(parsed: DataFrame, keys: set[Key]) -> dict[Key, list[StatusReport]]:
    """Every report of ``parsed`` of the pairs ``keys``, in the batch's order."""
    rows = _of_pairs(parsed, keys).orderBy("position").toArrow()
    found: dict[Key, list[StatusReport]] = {}
    for row in rows.to_pylist():
        found.setdefault((row["action_id"], row["device_id"]), []).append(_status_report(row))
    return found


def _of_pairs(parsed: DataFrame, keys: set[Key]) -> DataFrame:
    """The reports of ``parsed`` of the pairs ``keys`` (the keys go to the tasks, no report to the driver)."""
    from pyspark.sql import functions as F

    wanted = parsed.sparkSession.createDataFrame(sorted(keys), "action_id string, device_id string")
    return parsed.join(F.broadcast(wanted), ["action_id", "device_id"])


def _report_row(report: StatusReport) -> dict[str, Any]:
    return {name: getattr(report, name) for name in _REPORT_ROW_FIELDS}


def _status_report(row: Mapping[str, Any]) -> StatusReport:
    return StatusReport(**{name: row[name] for name in _REPORT_ROW_FIELDS})


_REPORT_ROW_FIELDS = ("action_id", "device_id", "state", "seq", "ts", "details", "attempt", "received_at")


def _arrow_schema(ddl: str) -> pa.Schema:
    """The Arrow schema of a DDL string of this module (its few types only)."""
    kinds = {
        "string": pa.string(),
        "long": pa.int64(),
        "int": pa.int32(),
        "array<string>": pa.list_(pa.string()),
    }
    fields = [column.strip().split(" ", 1) for column in ddl.split(", ")]
    return pa.schema([pa.field(name, kinds[kind]) for name, kind in fields])
