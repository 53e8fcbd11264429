"""The new-topic cost bench (bench/topics_floor.py) runs every piece and prints a cost for each."""

from __future__ import annotations

from bench import topics_floor


def test_every_piece_and_the_floor_get_a_positive_cost(capsys) -> None:
    topics_floor.main(["--topics", "3000", "--rounds", "1"])
    lines = capsys.readouterr().out.splitlines()
    costs = {line.rsplit(":", 1)[0].strip(): float(line.rsplit(":", 1)[1]) for line in lines[1:]}
    assert set(costs) == {
        *topics_floor.PIECES,
        "the store's pieces together",
        "floor (dict, catalog bytes, two columns)",
    }
    assert all(cost > 0 for cost in costs.values())
    together = sum(costs[label] for label in topics_floor.PIECES)
    # each printed cost is rounded by up to 0.005: their sum may stray by that much per term
    rounding = 0.005 * (len(topics_floor.PIECES) + 1)
    assert abs(costs["the store's pieces together"] - together) <= rounding + 1e-9
