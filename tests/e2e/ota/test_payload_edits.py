"""A running action's payload rewritten in place by another tool (``UPDATE actions SET payload = ...``).

Before, the devices not sent the action yet received the edited build, which no phase gate or abort rule
had judged. The job now keeps the build it took the action in with (``action_summary.accepted_payload``),
goes on sending it, and says that it refused the edit (a WARNING and ``action_summary.payload_change``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable

from tests.e2e.ota.conftest import (
    SHA256,
    action_row,
    actions_stack,
    epoch_ms,
    summary,
    wait_for,
    write_actions,
)
from tests.fleet_harness import quiet_devices

EDITED = "9.9.9"


def rewrite_payload(location: str, action_id: str, version: str) -> None:
    """What another tool does: the row's payload replaced in place (a delta-rs merge updating the matched
    row, as ``UPDATE actions SET payload = ... WHERE id = ...`` would), not through timestone."""
    table = DeltaTable(location)
    payload_type = pa.schema(table.schema().to_arrow()).field("payload").type
    payload = {"version": version, "url": f"https://example.invalid/fw-{version}.bin", "sha256": SHA256}
    source = pa.table(
        {
            "id": pa.array([action_id], pa.string()),
            "payload": pa.array([payload | {"size": 1024, "command": None, "args": None}], payload_type),
        }
    )
    merge = table.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
    merge.when_matched_update(updates={"payload": "s.payload"}).execute()


def test_a_payload_rewritten_in_place_is_refused_and_the_build_it_started_with_goes_on(
    spark, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="pipelines.actions.engine")
    with actions_stack(spark, tmp_path, {"count": 4, "groups": ["g"]}, quiet_devices()) as stack:
        store = stack.store
        write_actions(store, [action_row("pe-1", group="g", max_per_minute=30)], 0)
        wait_for(lambda: store.read_arrow("action_executions").num_rows == 4, what="the fan-out")
        edited_at = datetime.now(UTC)
        rewrite_payload(store.location("actions"), "pe-1", EDITED)
        (row,) = store.read_arrow("actions").to_pylist()
        assert row["payload"]["version"] == EDITED

        wait_for(lambda: (summary(store, "pe-1") or {}).get("action_state") == "COMPLETED", 90, "the rollout")
        sent = store.read_arrow("action_executions").to_pylist()
        assert any(epoch_ms(r["published_at"]) > epoch_ms(edited_at) for r in sent)  # sent after the edit
        assert {d.device_id: d.firmware for d in stack.fleet.devices} == {
            d.device_id: "2.0.0" for d in stack.fleet.devices
        }
        done = summary(store, "pe-1") or {}
        assert done["payload_change"] == (
            "payload changed in place after the action started (payload.url, payload.version): refused, "
            "it goes on with the payload it started with (write a new action to send another)"
        )
        assert done["accepted_payload"] is not None and '"version":"2.0.0"' in done["accepted_payload"]
        warned = [r.getMessage() for r in caplog.records if "payload changed in place" in r.getMessage()]
        assert warned and warned[0].startswith("action pe-1: payload changed in place")
