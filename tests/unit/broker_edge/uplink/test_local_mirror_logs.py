"""A broker alone's ``mirror_logs`` port: another broker's frames at its offsets, acknowledged once durable,
the topics of one batch made durable together."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker_edge.engine.ports import MirrorPart
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.uplink.mirror import LocalMirrorLogs
from tests.unit.broker_edge.storage.log_helpers import make_record


class CountingStore(LogStore):
    """A store counting the cuts of its group commit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cuts = 0

    async def wait_durable(self) -> None:
        self.cuts += 1
        await super().wait_durable()


def test_the_topics_of_one_batch_are_made_durable_together_and_answered_with_their_durable_ends(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        with LogStore(tmp_path / "site", StorageConfig(durability="none")) as site:
            for topic in ("a", "b", "c"):
                for n in range(4):
                    site.append(topic, make_record(n))
            site.flush()
            frames = {
                topic: b"".join(site.replicated_log.read_frames(topic, 0, 1 << 20)[0])
                for topic in ("a", "b", "c")
            }
        store = CountingStore(tmp_path / "hub", StorageConfig(durability="group"))
        store.open()
        logs = LocalMirrorLogs(store)
        try:
            appended = await logs.append([MirrorPart(t, 0, 4, frames[t]) for t in ("a", "b", "c")])
            assert store.cuts == 1
            assert [(a.records, a.end) for a in appended] == [(4, 4)] * 3
            assert [store.durable_end(topic) for topic in ("a", "b", "c")] == [4, 4, 4]
            (again,) = await logs.append([MirrorPart("a", 0, 4, frames["a"])])  # sent again: all held
            assert (again.duplicates, again.end, store.cuts) == (4, 4, 2)
        finally:
            store.close()

    asyncio.run(scenario())
