"""The host's bookkeeping of an edge node's sequence numbers for its Reorder Timeout (Sparkplug 3.0, 5.8)."""

from __future__ import annotations

from pipelines.sparkplug_host.reorder import Sequence


def test_numbers_in_order_wrap_from_255_to_0_whole():
    sequence = Sequence.after_birth(250)
    assert all(sequence.take(seq % 256) for seq in range(251, 300))
    assert sequence.expected == 300 % 256


def test_numbers_skipped_are_missing_until_they_arrive_late_even_across_the_wrap():
    sequence = Sequence.after_birth(252)
    assert sequence.take(253)
    assert not sequence.take(1)  # 254, 255 and 0 skipped
    assert sequence.missing == {254, 255, 0}
    assert not sequence.take(255) and not sequence.take(0)
    assert sequence.take(254) and sequence.expected == 2
    assert sequence.take(2)


def test_a_number_that_came_already_keeps_the_sequence_broken_until_the_window_closes():
    sequence = Sequence.after_birth(0)
    assert sequence.take(1)
    assert not sequence.take(1)  # sent twice
    assert not sequence.take(2)  # nothing that follows puts it in order
    sequence.close()
    assert sequence.whole and sequence.take(3)
