"""Seldom-set attributes in a side object: what an idle client's connection and session hold, and when."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from broker_edge.engine.rare_fields import RareField, RareSlots
from broker_edge.protocol.packets import MQTT_3_1_1, Publish, Subscribe, Subscription, Will
from broker_edge.security.limits import TokenBucket
from tests.unit.broker_edge.engine.handlers.wire import make_core


class _Side(RareSlots):
    __slots__ = ("count", "label")
    defaults: ClassVar[dict[str, Any]] = {}


class _Owner:
    __slots__ = ("_rare",)
    label: RareField[str | None] = RareField(_Side, None)
    count: RareField[int] = RareField(_Side, 0)

    def __init__(self) -> None:
        self._rare: _Side | None = None


def test_defaults_are_read_without_a_side_object_and_writing_them_makes_none():
    owner = _Owner()
    assert (owner.label, owner.count) == (None, 0)
    owner.label = None
    owner.count = 0
    assert owner._rare is None


def test_the_first_other_write_makes_the_side_object_that_then_holds_every_field():
    owner = _Owner()
    owner.count = 3
    assert isinstance(owner._rare, _Side)
    assert (owner.label, owner.count) == (None, 3)
    owner.label = "x"
    owner.count = 0
    assert (owner.label, owner.count) == ("x", 0)
    assert _Owner().count == 0, "another instance still reads the default"


def test_a_field_without_a_slot_in_its_side_class_is_refused_when_the_owner_is_defined():
    with pytest.raises((TypeError, RuntimeError)) as raised:  # Python 3.11 wraps it in a RuntimeError

        class _Broken:
            __slots__ = ("_rare",)
            missing: RareField[int] = RareField(_Side, 0)

    error = raised.value.__cause__ or raised.value
    assert isinstance(error, TypeError) and "_Side has no slot for _Broken.missing" in str(error)


def test_an_idle_client_holds_no_side_object_and_no_rate_bucket_of_its_own():
    core = make_core()  # the default limits: 100 messages/s per client
    client = core.client(MQTT_3_1_1)
    client.connect("idle-device", keep_alive=600)
    conn = client.conn
    session = core.router.sessions["idle-device"]
    assert conn._rare is None and session._rare is None
    assert conn.inbound is None and conn.incoming_pending == 0

    client.send(Publish("plant/meter", b"1"))
    assert conn.inbound is not None and isinstance(conn.inbound.bucket, TokenBucket)
    assert conn.inbound.bucket.available(core.now()) == 199, "the burst, less the publish just taken"


def test_a_client_that_only_subscribes_holds_no_inbound_and_an_exempt_publisher_no_bucket():
    core = make_core(limits={"exempt_users": ["gateway"]})
    listener, gateway = core.client(MQTT_3_1_1), core.client(MQTT_3_1_1)
    listener.connect("listener")
    listener.send(Subscribe(1, [Subscription("plant/#", 1)]))
    gateway.connect("gateway", username="gateway")
    assert listener.conn.inbound is None and gateway.conn.inbound is None

    gateway.send(Publish("plant/meter", b"1", qos=1, packet_id=1))
    assert listener.conn.inbound is None, "deliveries and their PUBACKs need none"
    assert gateway.conn.inbound is not None and gateway.conn.inbound.bucket is None, "exempt: unlimited"


def test_a_will_is_kept_in_the_side_object():
    core = make_core()
    client = core.client(MQTT_3_1_1)
    client.connect("device", will=Will("devices/device/status", b"offline"))
    assert client.conn._rare is not None
    assert client.conn.will == Will("devices/device/status", b"offline")
    assert client.conn.refused is None and client.conn.terms.problem_information is True
