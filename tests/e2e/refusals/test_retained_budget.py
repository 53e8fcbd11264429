"""Retained messages within a byte budget, in all and per publishing client: a message over either is
delivered live but not kept, counted by reason and logged with client id, topic and size."""

from __future__ import annotations

import logging

from tests.e2e.broker_clients import PahoClient, wait_for

KIB = b"x" * 1000


def test_retained_bytes_stop_at_the_client_share_and_at_the_total(start_broker, caplog):
    caplog.set_level(logging.INFO)
    broker = start_broker(retain={"max_retained_bytes": 3500, "max_retained_bytes_per_client": 2100})
    live = PahoClient(broker.port, "dashboard")
    assert live.subscribe("site/#", 1) == [1]
    greedy = PahoClient(broker.port, "greedy")
    for number in range(3):
        greedy.publish(f"site/greedy/{number}", KIB, 1, retain=True)
    assert len(live.expect(3)) == 3  # all delivered live, the third not kept
    assert wait_for(lambda: broker.drops("retained_client_bytes") == 1)

    other = PahoClient(broker.port, "other")
    other.publish("site/other/0", KIB, 1, retain=True)
    other.publish("site/other/1", KIB, 1, retain=True)  # the total would pass 3500
    assert wait_for(lambda: broker.drops("retained_bytes") == 1)
    greedy.publish("site/greedy/0", b"", 1, retain=True)  # clearing gives its bytes back
    other.publish("site/other/1", KIB, 1, retain=True)

    late = PahoClient(broker.port, "late")
    assert late.subscribe("site/#", 1) == [1]
    kept = sorted(message.topic for message in late.expect(3))
    assert kept == ["site/greedy/1", "site/other/0", "site/other/1"]
    [line] = [r for r in caplog.records if getattr(r, "reason", None) == "retained_client_bytes"]
    assert (line.client_id, line.topic, line.action, line.bytes) == (
        "greedy",
        "site/greedy/2",
        "retain",
        1013,
    )
    assert line.levelno == logging.WARNING
