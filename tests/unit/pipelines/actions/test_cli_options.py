"""``timestone ota`` takes its table options before or after the verb."""

from __future__ import annotations

import pytest

from pipelines.actions.cli import build_parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--tables-root", "/data/tables", "status"],
        ["status", "--tables-root", "/data/tables"],
        ["--config", "x.yaml", "status", "--tables-root", "/data/tables"],
    ],
)
def test_tables_root_is_read_before_or_after_the_verb(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.verb, args.tables_root) == ("status", "/data/tables")


def test_an_option_after_the_verb_wins_and_an_absent_one_stays_unset() -> None:
    args = build_parser().parse_args(["--config", "a.yaml", "cancel", "--config", "b.yaml", "act-1"])
    assert (args.config, args.tables_root, args.action_id) == ("b.yaml", None, "act-1")
