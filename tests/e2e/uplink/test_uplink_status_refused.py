"""``timestone uplink status`` against a broker whose offsets API refuses it: the reason and what to give."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.uplink.status_cli import uplink_main


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ([], "needs a reader token of its offsets API: give --token"),
        (["--token", "wrong"], "refused the token: give a reader token of its offsets API"),
    ],
)
def test_a_token_missing_or_refused_is_said_with_what_to_give(tmp_path: Path, capsys, token, said) -> None:
    """It said only ``http://...:9884 answered 401``."""
    tokens = [{"name": "spark", "token": "s3cret"}]
    with BrokerProcess(tmp_path / "hub", offsets_api={"tokens": tokens}) as broker:
        assert uplink_main(["status", "--broker", broker.offsets_url, *token]) == 1
    err = capsys.readouterr().err
    assert err == f"timestone uplink: {broker.offsets_url} {said} (401: missing or invalid bearer token)\n"
