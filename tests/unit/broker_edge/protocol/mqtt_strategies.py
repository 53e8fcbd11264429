"""Hypothesis strategies for valid MQTT packets, per protocol version and direction."""

from hypothesis import strategies as st

from broker_edge.protocol import (
    MQTT_3_1,
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from broker_edge.protocol import reason_codes as rc
from broker_edge.protocol.packets import PROTOCOL_NAMES
from broker_edge.protocol.properties import PROPERTY_SPECS, WILL, PropertyType

texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
binaries = st.binary(max_size=24)
packet_ids = st.integers(1, 0xFFFF)
qos_levels = st.integers(0, 2)
_topic_chars = st.characters(exclude_categories=["Cs"], exclude_characters="\x00+#")
topic_names = st.text(_topic_chars, min_size=1, max_size=16)
topic_filters = st.one_of(
    topic_names,
    st.lists(
        st.one_of(st.just("+"), st.text(_topic_chars.filter(lambda c: c != "/"), max_size=4)), min_size=1
    )
    .map("/".join)
    .filter(bool),
    topic_names.map(lambda name: name + "/#"),
    st.just("#"),
)

_VALUES = {
    PropertyType.BYTE: st.integers(0, 255),
    PropertyType.TWO_BYTE_INT: st.integers(0, 0xFFFF),
    PropertyType.FOUR_BYTE_INT: st.integers(0, 0xFFFFFFFF),
    PropertyType.VARINT: st.integers(1, 268_435_455),
    PropertyType.UTF8: texts,
    PropertyType.BINARY: binaries,
    PropertyType.UTF8_PAIR: st.tuples(texts, texts),
}


def _value(spec):
    if spec.boolean:
        return st.integers(0, 1)
    if spec.topic_name:
        return topic_names
    values = _VALUES[spec.type]
    return values.filter(bool) if spec.nonzero else values


@st.composite
def properties(draw, packet_type: int, exclude: tuple[str, ...] = ()):
    """Valid properties for ``packet_type`` (None when none are drawn, as the decoder returns them)."""
    props = Properties()
    for spec in PROPERTY_SPECS:
        if packet_type not in spec.packet_types or spec.name in exclude:
            continue
        if spec.repeatable_in or spec.name == "subscription_identifiers":
            most = 3 if packet_type in spec.repeatable_in else 1
            setattr(props, spec.name, draw(st.lists(_value(spec), max_size=most)))
        elif draw(st.booleans()):
            setattr(props, spec.name, draw(_value(spec)))
    if props.authentication_data is not None and props.authentication_method is None:
        props.authentication_method = draw(texts)
    return None if props.is_empty() else props


def _props(version: int, packet_type: int, exclude: tuple[str, ...] = ()):
    return properties(packet_type, exclude) if version == MQTT_5 else st.none()


@st.composite
def connects(draw, version: int):
    v5 = version == MQTT_5
    username = draw(st.none() | texts)
    password = draw(st.none() | binaries) if username is not None or version != 4 else None
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_names),
            draw(binaries),
            draw(qos_levels),
            draw(st.booleans()),
            draw(_props(version, WILL)),
        )
    return Connect(
        PROTOCOL_NAMES[version],
        version,
        draw(st.booleans()),
        draw(st.integers(0, 0xFFFF)),
        draw(texts),
        will,
        username,
        password,
        draw(_props(version, 1)) if v5 else None,
    )


@st.composite
def publishes(draw, version: int, from_server: bool):
    qos = draw(qos_levels)
    exclude = () if from_server else ("subscription_identifiers",)
    props = draw(_props(version, 3, exclude))
    topic = draw(topic_names)
    if props is not None and props.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return Publish(
        topic,
        draw(binaries),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_ids) if qos else None,
        props,
    )


def publish_acks(version: int):
    def ack(cls, packet_type: int, codes: frozenset[int]):
        if version != MQTT_5:
            return st.builds(cls, packet_ids)
        return st.builds(cls, packet_ids, st.sampled_from(sorted(codes)), properties(packet_type))

    return st.one_of(
        ack(PubAck, 4, rc.PUBACK_REASON_CODES),
        ack(PubRec, 5, rc.PUBREC_REASON_CODES),
        ack(PubRel, 6, rc.PUBREL_REASON_CODES),
        ack(PubComp, 7, rc.PUBCOMP_REASON_CODES),
    )


def subscriptions(version: int):
    if version != MQTT_5:
        return st.builds(Subscription, topic_filters, qos_levels)
    return st.builds(
        Subscription, topic_filters, qos_levels, st.booleans(), st.booleans(), st.integers(0, 2)
    ).filter(lambda sub: not (sub.no_local and sub.topic_filter.startswith("$share/")))


def client_packets(version: int):
    """Packets a client sends, CONNECT excepted."""
    common = [
        publishes(version, from_server=False),
        publish_acks(version),
        st.builds(
            Subscribe,
            packet_ids,
            st.lists(subscriptions(version), min_size=1, max_size=4),
            _props(version, 8),
        ),
        st.builds(
            Unsubscribe, packet_ids, st.lists(topic_filters, min_size=1, max_size=4), _props(version, 10)
        ),
        st.just(PingReq()),
    ]
    if version == MQTT_5:
        common += [
            st.builds(Disconnect, st.sampled_from(sorted(rc.DISCONNECT_REASON_CODES)), properties(14)),
            auths(),
        ]
    else:
        common.append(st.just(Disconnect()))
    return st.one_of(common)


def auths():
    with_method = properties(15).map(lambda p: p or Properties()).map(_with_auth_method)
    return st.one_of(
        st.just(Auth()),
        st.builds(Auth, st.sampled_from(sorted(rc.AUTH_REASON_CODES)), with_method),
    )


def _with_auth_method(props: Properties) -> Properties:
    if props.authentication_method is None:
        props.authentication_method = "SCRAM-SHA-1"
    return props


@st.composite
def connacks(draw, version: int):
    if version == MQTT_5:
        code = draw(st.sampled_from(sorted(rc.CONNACK_REASON_CODES)))
    else:
        code = draw(st.sampled_from(list(rc.ConnectReturnCode)))
    return ConnAck(draw(st.booleans()) if code == 0 else False, int(code), draw(_props(version, 2)))


def server_packets(version: int):
    """Packets a server sends."""
    v5 = version == MQTT_5
    suback_codes = rc.SUBACK_REASON_CODES if v5 else rc.SUBACK_RETURN_CODES_V3
    packets = [
        connacks(version),
        publishes(version, from_server=True),
        publish_acks(version),
        st.builds(
            SubAck,
            packet_ids,
            st.lists(st.sampled_from(sorted(suback_codes)), min_size=1),
            _props(version, 9),
        ),
        st.just(PingResp()),
    ]
    if v5:
        packets += [
            st.builds(
                UnsubAck,
                packet_ids,
                st.lists(st.sampled_from(sorted(rc.UNSUBACK_REASON_CODES)), min_size=1),
                properties(11),
            ),
            st.builds(Disconnect, st.sampled_from(sorted(rc.DISCONNECT_REASON_CODES)), properties(14)),
            auths(),
        ]
    else:
        packets.append(st.builds(UnsubAck, packet_ids))
    return st.one_of(packets)


VERSIONS = (MQTT_3_1, 4, MQTT_5)
