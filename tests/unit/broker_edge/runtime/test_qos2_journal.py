"""The journal of incoming QoS 2 ids between two session snapshots: written, rotated, replayed, forgotten."""

from __future__ import annotations

from pathlib import Path

from broker_edge.engine.routing.router import Router
from broker_edge.runtime.qos2_journal import Qos2Journal
from broker_edge.security.limits import LimitsConfig


def restored_router(*client_ids: str) -> Router:
    router = Router(LimitsConfig())
    for client_id in client_ids:
        router.restore_session(client_id, 300, None, None)
    return router


def test_the_last_line_of_each_id_wins_across_generations_and_a_cut_line_is_skipped(tmp_path: Path) -> None:
    journal = Qos2Journal(tmp_path)
    journal.record("dev", 1, True)
    journal.record("dev", 2, True)
    since = journal.rotate()
    journal.record("dev", 1, False)
    journal.record("dev", 3, True)
    journal.record("gone", 4, True)  # a session the snapshot does not have
    journal.close()
    with (tmp_path / f"qos2-ids.{since}").open("a") as file:
        file.write('["dev",5,')  # a power cut in the middle of a line

    router = restored_router("dev")
    assert Qos2Journal(tmp_path).replay(router, since).held == 1
    assert router.sessions["dev"].incoming_qos2 == {3}  # 2 was before the snapshot: it has it if held

    everything = restored_router("dev")
    Qos2Journal(tmp_path).replay(everything, None)
    assert everything.sessions["dev"].incoming_qos2 == {2, 3}


def test_a_restored_id_reused_without_dup_is_a_new_message_and_with_dup_a_resend(tmp_path: Path) -> None:
    journal = Qos2Journal(tmp_path)
    journal.record("dev", 7, True)
    journal.record("dev", 8, True)
    journal.close()
    router = restored_router("dev")
    Qos2Journal(tmp_path).replay(router, None)
    session = router.sessions["dev"]
    assert not session.reused(7, dup=True)  # the client's resend: answered, not routed again
    assert session.reused(8, dup=False)  # the id was free for the client: released, a new message
    assert session.incoming_qos2 == {7}


def test_a_written_snapshot_deletes_the_generations_before_its_own(tmp_path: Path) -> None:
    journal = Qos2Journal(tmp_path)
    first = journal.generation
    second = journal.rotate()
    third = journal.rotate()
    journal.forget_before(third)
    assert sorted(path.name for path in tmp_path.iterdir()) == [f"qos2-ids.{third}"]
    assert first < second < third
    assert Qos2Journal(tmp_path).generation == third + 1
