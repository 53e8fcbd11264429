"""Topic names and filters: validation, matching, $share and $offset parsing."""

import pytest
from hypothesis import given

from broker_edge.protocol import (
    InvalidTopic,
    OffsetStart,
    OffsetStartKind,
    ReasonCode,
    parse_offset_filter,
    parse_offset_start,
    parse_shared,
    topic_levels,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)
from tests.unit.broker_edge.protocol.mqtt_strategies import topic_names


@pytest.mark.parametrize("name", ["a", "a/b", "/", "a//b", "$SYS/broker/load", "plant/1/temp", "ü/€"])
def test_valid_topic_names(name):
    validate_topic_name(name)


@pytest.mark.mqtt311("MQTT-4.7.3-1")
@pytest.mark.mqtt5("MQTT-4.7.3-1")
@pytest.mark.parametrize("name", ["", "a/+", "a/#", "+", "#", "a\x00b", "a+b"])
def test_invalid_topic_names(name):
    with pytest.raises(InvalidTopic) as caught:
        validate_topic_name(name)
    assert caught.value.reason_code == ReasonCode.TOPIC_NAME_INVALID


@pytest.mark.mqtt311("MQTT-4.7.3-3")
@pytest.mark.mqtt5("MQTT-4.7.3-3")
def test_topic_name_longer_than_65535_bytes_is_invalid():
    with pytest.raises(InvalidTopic):
        validate_topic_name("€" * 21846)  # 3 bytes each: 65538 bytes
    validate_topic_name("€" * 21845)


@pytest.mark.parametrize(
    "topic_filter", ["a", "#", "+", "a/#", "a/+/c", "+/+", "/+", "a//#", "$share/g/a/+", "$share/g/#"]
)
def test_valid_topic_filters(topic_filter):
    validate_topic_filter(topic_filter)


@pytest.mark.mqtt311("MQTT-4.7.1-2", "MQTT-4.7.1-3")
@pytest.mark.mqtt5("MQTT-4.7.1-1", "MQTT-4.7.1-2")
@pytest.mark.parametrize(
    "topic_filter",
    ["", "a/#/b", "a#", "a/b#", "a+", "+a/b", "##", "a\x00", "$share//a", "$share/g", "$share/g+/a"],
)
def test_invalid_topic_filters(topic_filter):
    with pytest.raises(InvalidTopic) as caught:
        validate_topic_filter(topic_filter)
    assert caught.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID


@pytest.mark.parametrize(
    ("topic_filter", "name", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/+", "a", False),
        ("a/+", "a/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/#", "ab", False),
        ("#", "a/b", True),
        ("#", "$SYS/load", False),
        ("+/load", "$SYS/load", False),
        ("$SYS/#", "$SYS/load", True),
        ("$SYS/+", "$SYS/load", True),
        ("a/+/c/#", "a/b/c", True),
        ("a/+/c/#", "a/b/d", False),
    ],
)
def test_topic_matches(topic_filter, name, expected):
    assert topic_matches(topic_filter, name) is expected


@given(topic_names)
def test_every_name_matches_itself_and_its_wildcard_forms(name):
    levels = name.split("/")
    assert topic_matches(name, name)
    assert topic_matches("/".join("+" for _ in levels), name) is not name.startswith("$")
    assert topic_matches(levels[0] + "/#", name)


@pytest.mark.parametrize(("name", "levels"), [("a", 1), ("a/b", 2), ("/", 2), ("a/b/c/", 4)])
def test_topic_levels(name, levels):
    assert topic_levels(name) == levels


@pytest.mark.mqtt5("MQTT-4.8.2-1", "MQTT-4.8.2-2")
def test_parse_shared():
    assert parse_shared("$share/workers/jobs/+") == ("workers", "jobs/+")
    assert parse_shared("jobs/+") == (None, "jobs/+")
    assert parse_shared("$shared/x") == (None, "$shared/x")
    for bad in ["$share/", "$share//a", "$share/g", "$share/g/", "$share/#/a", "$share/g/a/#/b"]:
        with pytest.raises(InvalidTopic):
            parse_shared(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", OffsetStart(OffsetStartKind.OFFSET, 0)),
        ("1234", OffsetStart(OffsetStartKind.OFFSET, 1234)),
        ("earliest", OffsetStart(OffsetStartKind.EARLIEST)),
        ("latest", OffsetStart(OffsetStartKind.LATEST)),
        ("time:1700000000000", OffsetStart(OffsetStartKind.TIMESTAMP, 1_700_000_000_000)),
    ],
)
def test_parse_offset_start(text, expected):
    assert parse_offset_start(text) == expected


@pytest.mark.parametrize(
    "text", ["", "-1", "+1", "1.5", "Earliest", "time:", "time:-5", "time:abc", "١٢", "9" * 20]
)
def test_parse_offset_start_rejects(text):
    with pytest.raises(ValueError):
        parse_offset_start(text)


def test_parse_offset_filter():
    assert parse_offset_filter("$offset/earliest/plant/+/temp") == (
        OffsetStart(OffsetStartKind.EARLIEST),
        "plant/+/temp",
    )
    assert parse_offset_filter("$offset/42/a") == (OffsetStart(OffsetStartKind.OFFSET, 42), "a")
    assert parse_offset_filter("plant/#") == (None, "plant/#")
    for bad in ["$offset/earliest", "$offset/soon/a", "$offset/1/", "$offset/1/a/#/b"]:
        with pytest.raises(InvalidTopic) as caught:
            parse_offset_filter(bad)
        assert caught.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID
