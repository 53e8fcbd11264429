"""Device buckets: how an action to an explicit list of device ids reaches exactly the listed devices.

Every device belongs to one of a fixed number of buckets, ``bucket_of(device_id, buckets)``: the CRC-32 of
its id's UTF-8 bytes modulo the bucket count. The count is a setting of the whole fleet, fixed like the
partitions of a topic (the job and the devices must agree on it). Each device subscribes to its bucket's
topic ``actions/buckets/<bucket>``; an explicit-id action is one message per bucket holding a listed device,
and that message lists the targeted ids of its bucket only. A device starts the action only if its id is
listed (docs/device-protocol.md). A device reports on its bucket's report topic ``actions/reports/<bucket>``,
each report naming its device: a fleet's reports are at most as many logs as it has buckets, however many
devices it has.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

DEFAULT_BUCKETS = 1024
"""Buckets of a fleet unless configured: about ten devices per bucket at 10,000 devices."""


def bucket_of(device_id: str, buckets: int) -> int:
    """The bucket of ``device_id`` among ``buckets`` (stable across processes, runs and languages)."""
    return zlib.crc32(device_id.encode()) % buckets


REPORT_TOPICS = "actions/reports/+"
"""Topic filter of every bucket's status reports."""


def bucket_topic(bucket: int) -> str:
    """The topic of the actions for the devices of ``bucket``."""
    return f"actions/buckets/{bucket}"


def report_topic(bucket: int) -> str:
    """The topic the devices of ``bucket`` send their status reports on."""
    return f"actions/reports/{bucket}"


def by_bucket(device_ids: Iterable[str], buckets: int) -> dict[int, list[str]]:
    """The device ids grouped by bucket, each group in the order given."""
    groups: dict[int, list[str]] = {}
    for device_id in device_ids:
        groups.setdefault(bucket_of(device_id, buckets), []).append(device_id)
    return groups
