"""A hub whose gaps journal cannot be written (a full disk, a read-only file, here a directory in its place)
still acknowledges the batch whose records follow a gap, counts the gap and says it, with an ERROR naming the
journal, where the connection closed with a traceback and no ERROR to the site, and the gap (held in the
log) was never counted nor said: the next connection's ends were past it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import (
    batch_message,
    converse_as_site,
    frames_at,
    hub_port,
    hub_section,
    pki_in,
)

pytestmark = pytest.mark.timeout(60)


def test_a_gap_the_hub_cannot_journal_is_acknowledged_counted_and_said(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    store, uplink_hub = hub.broker.store, hub.broker.uplink_hub
    assert store is not None and uplink_hub is not None
    journal = Path(store.layout.meta) / "uplink-gaps.jsonl"
    journal.mkdir()
    port = hub_port(hub)
    first = converse_as_site(pki, "plant-g", port, [batch_message("t/g", 0, frames_at(0, [b"a", b"b"]))])
    assert first[1] is not None and first[1].header["ends"] == {"t/g": 2}

    answers = converse_as_site(pki, "plant-g", port, [batch_message("t/g", 5, frames_at(5, [b"f"]))])
    assert answers[1] is not None and answers[1].header == {"seq": 0, "ends": {"t/g": 6}}
    assert hub.call(lambda: uplink_hub.status.site("plant-g").gap_records) == 3
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.exc_info for r in errors] == [None]
    text = errors[0].getMessage()
    assert str(journal) in text and "'t/g' [2, 5)" in text and "plant-g" in text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("records [2, 5) never reached the hub" in w for w in warnings)
