"""`storage.max_record_bytes` has a floor: a value below the record of a 1-byte payload from the longest
client id the broker accepts is refused at load, naming the key and the floor. Below it, the broker started
and then answered every logged publish of such a client 0x80 (unspecified error), the log refusing the
record, with nothing at start to say the setting could never hold one. The floor counts the 2-byte packet
id a QoS 2 publish's record keeps: without it, at the least value accepted a QoS 2 publish of the longest
client id was refused so."""

from __future__ import annotations

import pytest

from broker_edge.config import ConfigError
from broker_edge.protocol.packets import PubAck, Publish, PubRec
from broker_edge.settings.broker import load_broker_config
from tests.e2e.broker_clients import RawClient
from tests.e2e.commitlog.e2e_helpers import offsets_client

FLOOR_23 = 21 + 2 + 23 + 1
"""The floor with ``limits.max_client_id_length: 23``: a record's 21-byte header, the packet id of a QoS 2
publish, the id, 1 payload byte."""


def test_a_record_bound_below_the_smallest_record_is_refused_naming_the_floor(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("storage:\n  max_record_bytes: 100\n")

    with pytest.raises(ConfigError) as refused:
        load_broker_config(path)

    assert refused.value.path == "storage.max_record_bytes"
    assert refused.value.detail == (
        "must be at least 152, the record of a 1-byte QoS 2 payload from a client id of "
        "limits.max_client_id_length (128) bytes: a 21-byte header, the 2-byte packet id a QoS 2 record "
        "keeps, the client id and the payload; got 100"
    )


@pytest.mark.parametrize(("qos", "fits", "answer"), [(1, b"xyz", PubAck), (2, b"x", PubRec)])
def test_at_the_least_bound_accepted_the_longest_client_id_logs_a_one_byte_payload(
    brokers, qos: int, fits: bytes, answer: type[PubAck | PubRec]
) -> None:
    """At QoS 2 the largest payload that fits is 1 byte (the record keeps the packet id), at QoS 1 3 bytes;
    one byte more is refused 0x80 by the log. One byte below the floor does not load."""
    limits = {"max_client_id_length": 23}
    with pytest.raises(ConfigError, match=f"must be at least {FLOOR_23},"):
        brokers("below", storage={"max_record_bytes": FLOOR_23 - 1}, limits=limits)
    broker = brokers(storage={"max_record_bytes": FLOOR_23}, limits=limits)
    device = RawClient(broker.port, 5)
    device.connect("d" * 23)

    device.send_packet(Publish("floor/1", fits, qos, packet_id=1))
    first = device.recv()
    device.send_packet(Publish("floor/1", fits + b"!", qos, packet_id=2))
    second = device.recv()

    assert isinstance(first, answer) and first.reason_code == 0x10, first  # logged, no subscriber
    assert isinstance(second, answer) and second.reason_code == 0x80, second  # one byte over the bound
    with offsets_client(broker) as api:
        assert api.fetch("floor/1", 0).data.column("payload").to_pylist() == [fits]
