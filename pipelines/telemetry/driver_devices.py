"""A batch's ``devices`` updates computed in the driver with Arrow, from its parsed rows collected there.

The same rows as :func:`pipelines.telemetry.transforms.device_updates` over
:func:`~pipelines.telemetry.transforms.telemetry_sightings` (a test holds the two to it), for a
configuration whose attributes are string payload fields and that adds no tag fields (what
:func:`supported` checks): a group-by over a hundred devices is a millisecond here, and was a Spark job
per batch. Where a device's latest rows tie on broker time, the first of them in the batch wins, as it does
in Spark's ``max_by``.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .config import DevicesConfig

#: The attributes a sighting carries, latest non-null value kept (``devices`` column, payload field).
_ATTRIBUTES = ("firmware_version", "group", "tags")


def supported(devices: DevicesConfig, field_types: dict[str, str]) -> bool:
    """Whether :func:`device_updates` gives this configuration's rows: no status topic, no tag fields, and
    attribute fields that are strings (Spark's cast of other types to string is not Arrow's)."""
    fields = [f for f in (devices.firmware_field, devices.group_field) if f]
    strings = all(field_types.get(f) == "string" for f in fields)
    return devices.status_template is None and not devices.tag_fields and strings


def device_updates(passed: pa.Table, devices: DevicesConfig, updated_at: datetime) -> pa.Table:
    """One row per device seen in ``passed``: its latest broker time and broker, and its latest known
    firmware, group and (non-empty) topic tags; null where the batch carries none."""
    sightings = pa.table(
        {
            "device_id": passed.column("device_id"),
            "timestamp": passed.column("timestamp"),
            "broker": passed.column("broker"),
            "firmware_version": _field_or_null(passed, devices.firmware_field),
            "group": _field_or_null(passed, devices.group_field),
            "tags": _non_empty(passed.column("topic_tags")),
            "_row": pa.array(np.arange(passed.num_rows)),
        }
    )
    device = sightings.column("device_id")
    seen = pc.and_(
        pc.and_(pc.is_valid(device), pc.not_equal(device, "")), pc.is_valid(sightings.column("timestamp"))
    )
    sightings = sightings.filter(pc.fill_null(seen, False))
    latest_first = [("device_id", "ascending"), ("timestamp", "descending"), ("_row", "ascending")]
    ordered = sightings.take(pc.sort_indices(sightings, latest_first))
    position = pa.array(np.arange(ordered.num_rows))
    picks = {"_latest": position}
    for name in _ATTRIBUTES:
        picks[f"_{name}"] = pc.if_else(
            pc.is_valid(ordered.column(name)), position, pa.scalar(None, pa.int64())
        )
    grouped = (
        pa.table({"device_id": ordered.column("device_id"), **picks})
        .group_by("device_id", use_threads=False)
        .aggregate([(name, "first") for name in picks])
    )
    latest = ordered.take(grouped.column("_latest_first"))
    updates: dict[str, pa.Array | pa.ChunkedArray] = {
        "device_id": latest.column("device_id"),
        "last_seen": latest.column("timestamp"),
        "broker": latest.column("broker"),
    }
    for name in ("firmware_version", "tags", "group"):
        updates[name] = ordered.column(name).take(grouped.column(f"_{name}_first"))
    updates["updated_at"] = pa.array([updated_at] * grouped.num_rows, pa.timestamp("us", "UTC"))
    return pa.table(updates)


def _field_or_null(rows: pa.Table, name: str | None) -> pa.ChunkedArray | pa.Array:
    if name:
        return rows.column(name)
    return pa.nulls(rows.num_rows, pa.string())


def _non_empty(tags: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """Tags, null where the map is empty (or null)."""
    entries = pa.list_(pa.struct([tags.type.key_field, tags.type.item_field]))  # a map is a list of them
    sizes = pc.fill_null(pc.list_value_length(tags.cast(entries)), 0)
    return pc.if_else(pc.greater(sizes, 0), tags, pa.scalar(None, tags.type))
