"""Tables written before the rollout columns existed are read and acted on: the job adds the columns, an
old row is the action it always was, old executions are their first attempt, and the actions change feed
reads across the versions before and after the columns were added."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql.types import StructType

from sinks import open_table_store
from sinks.spark_arrow import to_arrow
from sinks.tables import DEFAULT_CATALOG, TableCatalog
from sources.delta_cdf import cdf_schema, read_changes
from tests.e2e.ota.conftest import action_row
from tests.e2e.ota.rollout_harness import finals, rollout_run
from tests.fleet_harness import quiet_devices

ADDED = {
    "actions": (
        "exponential_rate",
        "phases",
        "abort_rules",
        "rollback",
        "retries",
        "schedule",
        "maintenance_windows",
        "continuous",
    ),
    "action_executions": ("attempt", "phase", "retry_at", "expires_at"),
    "action_summary": ("aborted_by", "rollback_action_id", "phase", "retries_count"),
}


def before_rollouts() -> TableCatalog:
    """The catalog as it was: the action tables without the columns rollouts added."""
    catalog = DEFAULT_CATALOG
    for name, added in ADDED.items():
        spec = catalog[name]
        kept = [field for field in spec.schema.fields if field.name not in added]
        catalog = catalog.replace(replace(spec, schema=StructType(kept)))
    return catalog


def test_old_tables_gain_the_columns_and_old_and_new_rows_both_roll_out(tmp_path):
    old = open_table_store(None, str(tmp_path / "tables"), backend="delta-rs", catalog=before_rollouts())
    for name in ADDED:
        old.ensure(name)
    now = datetime.now(UTC)
    earlier = {
        "action_id": "old-0",
        "device_id": "dev-00000",
        "state": "SUCCEEDED",
        "version": 3,
        "report_seq": 2,
        "status_details": "applied",
        **dict.fromkeys(("queued_at", "updated_at", "published_at", "started_at", "finished_at"), now),
    }
    old.append(
        "action_executions",
        pa.Table.from_pylist([earlier], schema=old.spec("action_executions").arrow_schema),
        "o",
        0,
    )
    row = {k: v for k, v in action_row("old-1", group="g").items() if k not in ADDED["actions"]}
    old.merge("actions", pa.Table.from_pylist([row], schema=old.spec("actions").arrow_schema), "o", 1)

    with rollout_run(tmp_path, quiet_devices(), count=4) as run:  # the engine opens the same tables
        for name, added in ADDED.items():
            assert set(added) <= set(run.store.read_arrow(name).column_names)
        phased = action_row("new-1", group="g", phases=[{"devices": 1, "wait_s": 60}, {}])
        run.store.merge(
            "actions", pa.Table.from_pylist([phased], schema=run.store.spec("actions").arrow_schema), "n", 2
        )

        path = run.store.location("actions")
        changes = read_changes(path, 0, run.store.version("actions"), to_arrow(cdf_schema(path)))
        rows = {
            r["id"]: r for r in changes.to_pylist() if r["_change_type"] in ("insert", "update_postimage")
        }
        assert rows["old-1"]["phases"] is None and rows["new-1"]["phases"][0]["devices"] == 1
        for batch, action_id in enumerate(("old-1", "new-1")):
            clean = {k: v for k, v in rows[action_id].items() if not k.startswith("_")}
            run.engine.on_action_rows([clean], "fanout", 100 + batch)

        run.feed(lambda reports: finals(reports, "old-1") == 4 and finals(reports, "new-1") == 1)
        run.tick_at(60)
        run.feed(lambda reports: finals(reports, "new-1") == 4)
        assert run.summary("old-1")["action_state"] == "COMPLETED"
        assert (run.summary("new-1")["action_state"], run.summary("new-1")["phase"]) == ("COMPLETED", 2)
        kept = run.executions("old-0")["dev-00000"]
        assert (kept["state"], kept["attempt"]) == (
            "SUCCEEDED",
            None,
        )  # as written: read as its first attempt
        attempts = run.engine.tables.execution_table(["old-0", "old-1", "new-1"])["attempt"]
        assert len(attempts) == 9 and attempts.null_count == 0 and set(attempts.to_pylist()) == {1}
