"""The store holds no offset past ``bounds.MAX_OFFSET``, whoever asks: a mirror's frames, a gap, a restart.

Every decoder of another party's numbers checks them first (``broker_edge.bounds``); the store refuses them
again, so that no caller it has can leave a log that the next start cannot open.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.bounds import MAX_OFFSET
from broker_edge.storage import InvalidRecord, LogStore, StorageConfig, StorageError
from broker_edge.storage.record import encode_record
from tests.unit.broker_edge.storage.log_helpers import make_record


def frames(first: int, count: int) -> bytes:
    return b"".join(encode_record(first + n, 1_000, make_record(n)) for n in range(count))


@pytest.mark.parametrize("at", [MAX_OFFSET + 1, 2**63 - 1])
def test_frames_at_an_offset_past_the_ceiling_are_refused_and_nothing_is_kept(
    tmp_path: Path, at: int
) -> None:
    with LogStore(tmp_path, StorageConfig(durability="none")) as store:
        with pytest.raises(InvalidRecord, match="past what a log holds"):
            store.replicated_log.append_at("t", frames(min(at, 2**64 - 1), 1), at=at)
        assert store.start_offset("t") == store.committed_end("t") == 0
    with LogStore(tmp_path, StorageConfig(durability="none")) as store:  # and it opens again
        assert store.start_offset("t") == store.committed_end("t") == 0


def test_frames_that_would_end_past_the_ceiling_are_refused_those_up_to_it_kept(tmp_path: Path) -> None:
    with LogStore(tmp_path, StorageConfig(durability="none")) as store:
        with pytest.raises(InvalidRecord, match=f"past {MAX_OFFSET}"):
            store.replicated_log.append_at("t", frames(MAX_OFFSET - 1, 2), at=MAX_OFFSET - 1)
        assert (
            store.replicated_log.append_at("t", frames(MAX_OFFSET - 1, 1), at=MAX_OFFSET - 1)
            == MAX_OFFSET - 1
        )
        store.flush()
        assert store.durable_end("t") == MAX_OFFSET
    with LogStore(tmp_path, StorageConfig(durability="none")) as store:
        assert store.durable_end("t") == MAX_OFFSET
        assert store.read("t", MAX_OFFSET - 1, 10)[0].payload == make_record(0).payload


@pytest.mark.parametrize("offset", [MAX_OFFSET + 1, 2**63 - 1, 2**64 + 5, -1])
def test_a_restart_past_the_ceiling_is_refused(tmp_path: Path, offset: int) -> None:
    with LogStore(tmp_path, StorageConfig(durability="none")) as store:
        store.append("t", make_record(0))
        store.flush()
        with pytest.raises(StorageError, match="cannot go on at offset"):
            store.replicated_log.restart_at("t", offset)
        with pytest.raises(StorageError, match="cannot go on at offset"):
            store.import_start("u", offset)
        assert store.durable_end("t") == 1
