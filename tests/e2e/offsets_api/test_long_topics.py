"""A topic as long as ``limits.max_topic_length`` lets devices publish is read back by its path: the offsets
API takes a request line as long as such a topic makes when percent-encoded (up to three times its bytes),
where aiohttp's 8,190 bytes refused topics past about 2,700 bytes of UTF-8 ('Got more than 8190 bytes')."""

from __future__ import annotations

from tests.e2e.broker_clients import PahoClient
from tests.e2e.commitlog.e2e_helpers import offsets_client


def test_a_topic_of_the_longest_length_allowed_is_read_by_its_path(start_broker):
    broker = start_broker(
        storage={}, offsets_api={"enabled": True, "port": 0}, limits={"max_topic_length": 6000}
    )
    topic = "fleet/" + "é" * 2990  # 5,986 bytes of UTF-8: 17,946 once percent-encoded
    publisher = PahoClient(broker.port, "long-topic")
    publisher.publish(topic, "reading", 1)
    publisher.disconnect()

    with offsets_client(broker) as client:
        fetched = client.fetch_records(topic, 0)
        info = client.log_info(topic)

    assert [record.payload for record in fetched.data] == [b"reading"]
    assert info.topic == topic and info.end_offset == 1
