"""QoS 2 ids a crash left in the log only: the records since the snapshot against the journal's lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.runtime import qos2_log_ids
from broker_edge.runtime.qos2_journal import Qos2Journal
from broker_edge.runtime.qos2_log_ids import hold_logged_ids
from broker_edge.storage import LogStore
from broker_edge.storage.config import StorageConfig
from broker_edge.storage.record import qos_with_packet_id
from tests.unit.broker_edge.runtime.test_qos2_journal import restored_router


def _append_qos2(store: LogStore, topic: str, client_id: str, packet_id: int | None) -> None:
    qos = 2 if packet_id is None else qos_with_packet_id(2, packet_id)
    store.append_batch(topic, [(b"m", qos, False, client_id, (), None, None, None, None, None)])


@pytest.mark.parametrize("columnar", [True, False])
def test_an_id_with_more_records_than_releases_and_no_held_line_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columnar: bool
) -> None:
    """Read as runs of frames, or as records (a broker without numpy): the same ids."""
    monkeypatch.setattr(qos2_log_ids, "COLUMNAR", columnar)
    store = LogStore(tmp_path / "data", StorageConfig())
    store.open()
    try:
        _append_qos2(store, "t/before", "dev", 1)  # before the snapshot: not looked at
        store.flush()
        since = store.end_offsets()
        _append_qos2(store, "t/a", "dev", 2)  # answered and released, then reused: the crash came first
        _append_qos2(store, "t/b", "dev", 2)
        _append_qos2(store, "t/a", "dev", 3)  # answered, released
        _append_qos2(store, "t/a", "dev", 4)  # answered (held)
        _append_qos2(store, "t/a", "dev", 5)  # appended, then the crash
        _append_qos2(store, "t/a", "dev", None)  # a record without an id (an older broker's)
        _append_qos2(store, "t/a", "other", 6)  # a client without a persistent session
        store.flush()
        journals = tmp_path / "meta"
        journals.mkdir()
        journal = Qos2Journal(journals)
        for packet_id, held in ((2, True), (2, False), (3, True), (3, False), (4, True)):
            journal.record("dev", packet_id, held)
        journal.close()
        router = restored_router("dev")
        replayed = Qos2Journal(journals)
        state = replayed.replay(router, None)
        router.qos2_journal = replayed.record
        assert hold_logged_ids(router, store, since, state) == 2
        assert router.sessions["dev"].incoming_qos2 == {2, 4, 5}
        assert not router.sessions["dev"].reused(5, dup=True)  # its resend: answered, not logged again
        replayed.close()
        again = restored_router("dev")
        assert Qos2Journal(journals).replay(again, None).held == 3  # written: a second crash has them
    finally:
        store.close()
