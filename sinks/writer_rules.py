"""What a Delta table asks of its writers, kept by the Spark tasks that write its files.

A table another tool made may carry rules for every writer: CHECK constraints
(``delta.constraints.<name>``), column invariants (``delta.invariants``) and generated columns
(``delta.generationExpression``). The tasks' Parquet writer (``parquet_files``) does not evaluate SQL, so
before it runs, Spark does, in the same tasks: :func:`with_rules` computes each generated column the rows
lack and adds :data:`BROKEN` naming, per row, the first rule it breaks (null: none). The writer
(:func:`check_rules`) fails its task on any such row, naming the rule, and drops the column: a batch that
breaks a rule writes nothing, as delta-rs's own writer refuses it, and the rows never leave the tasks.

Some tables ask more than the store can keep: column mapping (:func:`refuse_column_mapping`), writer
features delta-rs lacks and merges into an append-only table (:func:`refuse_unsupported_features`) are
refused, naming the table.

As in delta-rs, a rule whose expression is null for a row (a null column in it) does not fail it. A
generated column the rows carry must equal its expression.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from sinks.object_store import local_directory
from sinks.store import TableStoreError

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

__all__ = [
    "BROKEN",
    "RuleBroken",
    "WriterRules",
    "check_rules",
    "refuse_column_mapping",
    "refuse_unsupported_features",
    "rules_of",
    "with_rules",
]

BROKEN = "__timestone_broken_rule"
"""The column naming the first rule a row breaks, from :func:`with_rules` to the writer."""


#: How delta-rs' CommitFailedError says that the table needs writer features it does not implement.
UNSUPPORTED_FEATURES = "Unsupported table features required"
#: How it says that a write removes rows of an append-only table.
APPEND_ONLY = "Delta table is append-only"


class RuleBroken(ValueError):
    """Rows break a rule of the table: nothing of the batch is written."""


@dataclass(frozen=True)
class WriterRules:
    """A table's rules for its writers, each a Spark SQL expression."""

    checks: tuple[tuple[str, str], ...]
    """(what the rule is, the expression every row must make true), CHECK constraints and invariants."""
    generated: tuple[tuple[str, str], ...]
    """(column, its generation expression)."""

    def __bool__(self) -> bool:
        return bool(self.checks or self.generated)


def rules_of(table: DeltaTable) -> WriterRules:
    """The rules ``table`` sets its writers."""
    checks = [
        (f"CHECK constraint {key.removeprefix('delta.constraints.')} ({expression})", expression)
        for key, expression in sorted(table.metadata().configuration.items())
        if key.startswith("delta.constraints.") and expression
    ]
    generated = []
    for field in table.schema().fields:
        metadata = field.metadata
        if "delta.invariants" in metadata:
            invariant = json.loads(str(metadata["delta.invariants"]))
            expression = invariant["expression"]["expression"]
            checks.append((f"invariant of {field.name} ({expression})", expression))
        if "delta.generationExpression" in metadata:
            generated.append((field.name, str(metadata["delta.generationExpression"])))
    return WriterRules(tuple(checks), tuple(generated))


def with_rules(frame: DataFrame, rules: WriterRules) -> DataFrame:
    """``frame`` with the generated columns it lacks computed and :data:`BROKEN` added, both by Spark in
    the tasks (nothing is evaluated here)."""
    from pyspark.sql import functions as F

    checks = list(rules.checks)
    for column, expression in rules.generated:
        if column in frame.columns:
            checks.append((f"generated column {column} ({expression})", f"`{column}` <=> ({expression})"))
        else:
            frame = frame.withColumn(column, F.expr(expression))
    broken = [F.when(~F.expr(f"({expression})"), F.lit(label)) for label, expression in checks]
    return frame.withColumn(BROKEN, F.coalesce(*broken) if broken else F.lit(None).cast("string"))


def check_rules(batch: pa.RecordBatch, table: str) -> pa.RecordBatch:
    """``batch`` without :data:`BROKEN`; :class:`RuleBroken` naming the rule when a row breaks one."""
    index = batch.schema.get_field_index(BROKEN)
    if index < 0:
        return batch
    broken = batch.column(index)
    if broken.null_count < len(broken):
        rules = pc.drop_null(broken)
        raise RuleBroken(
            f"{table}: {len(rules)} rows failed validation check of its {rules[0].as_py()} (a rule of the "
            "table for its writers): nothing of the batch is written"
        )
    return batch.remove_column(index)


def refuse_unsupported_features(name: str, exc: Exception) -> None:
    """A :class:`TableStoreError` naming the table when ``exc`` (delta-rs' ``CommitFailedError``) says
    that it asks its writers for features delta-rs does not implement (identity columns, row tracking, a
    newer engine's), or that it is append-only and the write removes rows: no lost race, so no retry."""
    if UNSUPPORTED_FEATURES in str(exc):
        raise TableStoreError(
            f"{name}: the table asks its writers for features delta-rs does not have ({exc}): write it "
            "with the native Delta backend, or use a table without them"
        ) from None
    if APPEND_ONLY in str(exc):
        raise TableStoreError(
            f"{name}: the table is append-only (delta.appendOnly=true), and this write changes or removes "
            "rows of it (a merge): unset the property, or use a table without it"
        ) from None


def refuse_column_mapping(name: str, table: DeltaTable) -> None:
    """Refuse a table with column mapping: the tasks write its files under the logical column names, which
    a column-mapping reader does not find, and delta-rs reads back the physical names it writes as nulls."""
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise TableStoreError(
            f"{name}: uses column mapping (delta.columnMapping.mode={mode}), which the delta-rs store cannot "
            "write or read correctly: write it with the native Delta backend, or use a table without it"
        )


def refuse_foreign_files(name: str, location: str) -> None:
    """Refuse to create table ``name`` in a local directory that holds files but no Delta log (Parquet
    another tool wrote there, a table whose log was deleted): a table made over them would leave them out,
    and its vacuum would delete them as files no commit references."""
    directory = local_directory(location)
    if directory is None or not os.path.isdir(directory):
        return
    found = sorted(entry.name for entry in os.scandir(directory) if not entry.name.startswith("."))
    if found and "_delta_log" not in found:  # a log: another creator's table, being made now
        raise TableStoreError(
            f"{name}: {directory} holds files but no Delta table ({', '.join(found[:3])}"
            f"{', ...' if len(found) > 3 else ''}): a table made there would leave them out and its vacuum "
            "delete them; move them away, or choose another tables root"
        )
