"""Reads filtered on a column's values: only the matching rows and the asked columns come back, read as
the table's files are (delta-rs, no Spark), whole or record batch by record batch; a merge narrowed to the
target rows its keys can match does what the merge does without it."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from sinks import open_table_store
from sinks.delta_rs import DeltaRsTableStore
from sinks.store import Matching

NOW = datetime(2026, 11, 26, tzinfo=UTC)


@pytest.fixture
def registry(tmp_path) -> DeltaRsTableStore:
    """``devices`` in four files: groups g0..g3, 25 devices each."""
    store = open_table_store(None, str(tmp_path / "tables"), backend="delta-rs")
    assert isinstance(store, DeltaRsTableStore)
    schema = store.spec("devices").arrow_schema
    for part in range(4):
        rows = [
            {
                "device_id": f"d{part}-{i:02}",
                "group": f"g{part}",
                "firmware_version": "1.0.0",
                "last_seen": NOW,
            }
            for i in range(25)
        ]
        assert store.append("devices", pa.Table.from_pylist(rows, schema=schema), "tests", part)
    return store


def test_a_filtered_read_returns_only_the_matching_rows_in_the_asked_columns(registry):
    group = registry.read_arrow("devices", where=[Matching("group", ("g2",))], columns=["device_id", "group"])
    assert group.column_names == ["device_id", "group"]
    assert sorted(group["device_id"].to_pylist()) == [f"d2-{i:02}" for i in range(25)]

    both = registry.read_arrow(
        "devices", where=[Matching("group", ("g1", "g3")), Matching("device_id", ("d1-00", "d3-24", "d2-00"))]
    )
    assert both.schema == registry.read_arrow("devices").schema
    assert sorted(both["device_id"].to_pylist()) == ["d1-00", "d3-24"]
    assert registry.read_arrow("devices", where=[Matching("group", ())]).num_rows == 0


def test_a_scan_yields_the_matching_rows_batch_by_batch(registry):
    batches = list(registry.scan_arrow("devices", where=[Matching("group", ("g0", "g3"))], columns=["group"]))
    assert len(batches) >= 2  # one file after another, never the table at once
    assert all(batch.schema.names == ["group"] and batch.num_rows for batch in batches)
    counted = pa.Table.from_batches(batches)["group"].value_counts().to_pylist()
    assert sorted((c["values"], c["counts"]) for c in counted) == [("g0", 25), ("g3", 25)]


def test_a_merge_narrowed_to_the_targets_keys_updates_and_inserts_as_without(tmp_path):
    store = open_table_store(None, str(tmp_path / "tables"), backend="delta-rs")
    schema = store.spec("action_executions").arrow_schema
    odd = "it's a \\ 'quoted' id"

    def rows(action_id: str, devices: list[str], version: int) -> pa.Table:
        return pa.Table.from_pylist(
            [
                {"action_id": action_id, "device_id": d, "state": "QUEUED", "version": version}
                | {"report_seq": 0, "updated_at": NOW}
                for d in devices
            ],
            schema=schema,
        )

    assert store.append("action_executions", rows("plain", ["d1", "d2"], 1), "tests", 0)
    assert store.append("action_executions", rows(odd, ["d1", "d2"], 1), "tests", 1)
    changed = rows(odd, ["d2", "d3"], 2)
    assert store.merge(
        "action_executions",
        changed,
        "tests/merge",
        0,
        update_when="s.version > t.version",
        target_where=[Matching("action_id", (odd,))],
    )
    table = store.read_arrow("action_executions")
    found = sorted((r["action_id"], r["device_id"], r["version"]) for r in table.to_pylist())
    assert found == sorted(
        [("plain", "d1", 1), ("plain", "d2", 1), (odd, "d1", 1), (odd, "d2", 2), (odd, "d3", 2)]
    )
    with pytest.raises(ValueError, match="target_where on action_id with no values"):
        store.merge("action_executions", changed, "tests/merge", 1, target_where=[Matching("action_id", ())])
