"""The fault suite's checker on hand-written histories: a correct one passes, and each rule finds the one
history that breaks it (so a run that finds nothing has been checked for something)."""

from __future__ import annotations

from tests.e2e.faults.checker import Ack, Delivery, History, Silence, anomalies, payload

TOPIC = "faults/p0"


def _history(log: list[int], acked: list[int], replicas: int = 3) -> History:
    records = [(offset, payload("p0", sequence)) for offset, sequence in enumerate(log)]
    return History(
        acks={TOPIC: [Ack(sequence, "b1", 10.0 + sequence) for sequence in acked]},
        logs={f"b{i}": {TOPIC: list(records)} for i in range(1, replicas + 1)},
        deliveries=[Delivery("s1", TOPIC, data, offset) for offset, data in records],
    )


def test_a_correct_history_has_no_anomaly() -> None:
    assert anomalies(_history([0, 1, 2, 4, 5], acked=[0, 1, 4, 5])) == []  # 3 never stored, never acked


def test_an_acknowledged_publish_missing_from_the_log_is_found() -> None:
    assert anomalies(_history([0, 2], acked=[0, 1, 2])) == [
        "faults/p0: acknowledged 1 (by b1) is not in the log"
    ]


def test_a_payload_at_two_offsets_is_found() -> None:
    found = anomalies(_history([0, 1, 1, 2], acked=[0, 1, 2]))
    assert "faults/p0: p0:1 at 2 offsets [1, 2]" in found


def test_a_publisher_out_of_order_in_the_log_is_found() -> None:
    found = anomalies(_history([0, 2, 1, 3], acked=[0, 2, 1, 3]))
    assert "faults/p0: 1 at offset 2 after 2: out of the publisher's order" in found
    assert "faults/p0: 1 acknowledged after 2" in found


def test_replicas_that_differ_are_found() -> None:
    history = _history([0, 1], acked=[0, 1])
    history.logs["b3"][TOPIC] = [(0, payload("p0", 0))]
    assert anomalies(history) == ["faults/p0: the replicas on b1 and b3 differ"]


def test_a_delivery_at_an_offset_the_log_does_not_hold_it_at_is_found() -> None:
    history = _history([0, 1], acked=[0, 1])
    history.deliveries.append(Delivery("s2", TOPIC, payload("p0", 1), 0))
    assert anomalies(history) == [
        "s2: b'p0:1' delivered at offset 0 of faults/p0, where the log holds b'p0:0'"
    ]


def test_an_acknowledgement_from_a_silenced_broker_is_found() -> None:
    history = _history([0, 1], acked=[0, 1])
    history.silences.append(Silence("b1", 10.5, 12.0, "paused (SIGSTOP)"))
    assert anomalies(history) == ["faults/p0: 1 acknowledged by b1 while paused (SIGSTOP)"]
