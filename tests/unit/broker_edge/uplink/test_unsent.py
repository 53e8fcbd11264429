"""What a site holds that the hub lacks: the lag over its logs (the hub's ends as the link updates them), and
the unsent records its retention is about to delete."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_edge.storage import LogStore, StorageConfig
from broker_edge.uplink.unsent import UnsentRecords
from tests.unit.broker_edge.storage.log_helpers import make_record

RETENTION_MS = 100_000


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LogStore]:
    with LogStore(tmp_path / "site", StorageConfig(durability="none", retention_ms=RETENTION_MS)) as opened:
        yield opened


def append(store: LogStore, topic: str, count: int, age_ms: int) -> None:
    now_ms = int(time.time() * 1000)
    for n in range(count):
        store.append(topic, make_record(n, timestamp_ms=now_ms - age_ms + n))
    store.flush()


def test_the_lag_counts_what_the_hub_lacks_and_follows_its_ends_updated_in_place(store: LogStore) -> None:
    append(store, "site/old", 5, age_ms=60_000)
    append(store, "site/new", 3, age_ms=1_000)
    hub_ends = {"site/old": 2}
    elsewhere_ends = {"site/far": 7}  # a log held elsewhere: counted, not aged
    unsent = UnsentRecords(store, 0.8, lambda: ["site/old", "site/new"], hub_ends, elsewhere_ends)

    records, seconds = unsent.lag()  # outside an event loop: counted at each call

    assert records == 3 + 3 + 7
    assert 55 < seconds < 70  # site/old's record 2, the oldest the hub lacks
    hub_ends.update({"site/old": 5, "site/far": 7})
    assert unsent.lag()[0] == 3
    hub_ends["site/new"] = 3
    assert unsent.lag() == (0, 0.0)


def test_unsent_records_past_the_share_of_retention_are_at_risk_and_said_once_a_log(
    store: LogStore, caplog: pytest.LogCaptureFixture
) -> None:
    append(store, "site/ageing", 4, age_ms=int(RETENTION_MS * 0.9))
    append(store, "site/fresh", 4, age_ms=int(RETENTION_MS * 0.5))
    append(store, "site/sent", 4, age_ms=int(RETENTION_MS * 0.95))
    hub_ends = {"site/ageing": 1, "site/sent": 4}
    unsent = UnsentRecords(store, 0.8, lambda: ["site/ageing", "site/fresh", "site/sent"], hub_ends, {})

    with caplog.at_level(logging.WARNING, "broker_edge.uplink.site_link"):
        asyncio.run(unsent.check_retention())

    assert unsent.at_risk_records == 3
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 1 and "3 records of 'site/ageing' not yet sent" in warned[0]
    hub_ends["site/ageing"] = 4
    asyncio.run(unsent.check_retention())
    assert unsent.at_risk_records == 0
