"""A broker that comes back catches up on what was published while it was away without sending it live.

Subscribers that connect to a restarted broker subscribed after those publishes: they get what is
published from then on, as from a broker that never went away, while the broker's log (and so its offsets
API and log readers) holds every record at the same offsets as the others.
"""

from __future__ import annotations

from tests.e2e.broker_clients import PahoClient
from tests.e2e.cluster.proof import leadership_spread, read_log, wait_settled, wait_until

TOPIC = "plant/history/line-1"


def test_a_restarted_broker_does_not_send_what_was_published_while_it_was_down(three_brokers, etcd):
    a, c = three_brokers["a"], three_brokers["c"]
    c.stop()
    publisher = PahoClient(a.port, "history-publisher", version=5)
    for n in range(20):
        publisher.publish(TOPIC, f"while c was down {n}".encode(), 1)  # acknowledged by a and b

    c.start()
    subscriber = PahoClient(c.port, "late-subscriber", version=5)
    subscriber.subscribe("plant/#", 1)
    wait_settled(etcd, {"a", "b", "c"}, 3)
    wait_until(lambda: leadership_spread(etcd, ("a", "b", "c")), what="c leading its share again")
    wait_until(lambda: len(read_log(c, TOPIC)) == 20, what="c caught up on the history")

    publisher.publish(TOPIC, b"after c came back", 1)
    (message,) = subscriber.expect(1)
    assert message.payload == b"after c came back"
    subscriber.expect_none(1.0)  # none of the history, and the news once
    assert read_log(c, TOPIC) == read_log(a, TOPIC)
    assert [payload for _, payload in read_log(c, TOPIC)][:20] == [
        f"while c was down {n}".encode() for n in range(20)
    ]
