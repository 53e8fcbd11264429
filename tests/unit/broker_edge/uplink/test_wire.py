"""The uplink's messages: what is encoded decodes the same, and every malformed message is a ``WireError``."""

from __future__ import annotations

import zlib

import pytest

from broker_edge.uplink.wire import (
    BATCH,
    ENDS,
    HELLO,
    Batch,
    BatchTopic,
    WireError,
    decode,
    decode_batch,
    encode,
    encode_batch,
    ends_of,
    ends_pages,
    seq_of,
)


@pytest.mark.parametrize("codec", ["zstd", "zlib", "none"])
def test_a_batch_comes_back_as_it_was_sent(codec: str) -> None:
    frames = b"a" * 300 + b"b" * 200
    topics = [BatchTopic("t/a", 10, 3, 300), BatchTopic("t/b", 0, 2, 200)]
    batch = Batch(7, topics, frames, {"t/a": [13, 99], "t/c": [4, 120]}, {"t/c": 80})
    data = encode_batch(batch, codec)
    assert decode_batch(decode(data), limit=1000) == batch
    if codec != "none":
        assert len(data) < len(frames)


def test_a_header_travels_as_json() -> None:
    message = decode(encode(HELLO, {"version": 1, "site": "plant-1"}))
    assert (message.kind, message.header, message.body) == (HELLO, {"version": 1, "site": "plant-1"}, b"")


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x01\x00", "shorter than its prefix"),
        (b"\x63\x00\x00\x00\x02{}", "unknown message kind 99"),
        (b"\x01\x00\x00\x00\x09{}", "overruns"),
        (b"\x01\x00\x00\x00\x02[]", "not a JSON object"),
        (b"\x01\x00\x00\x00\x02{x", "not JSON"),
    ],
)
def test_a_malformed_message_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        decode(data)


def test_a_batch_that_unpacks_past_the_limit_is_refused() -> None:
    for codec in ("zstd", "zlib"):
        data = encode_batch(Batch(0, [BatchTopic("t", 0, 1, 4000)], b"\0" * 10_000), codec)
        with pytest.raises(WireError, match="past 4096"):
            decode_batch(decode(data), limit=4096)


@pytest.mark.parametrize(
    ("header", "body", "why"),
    [
        ({"seq": 1, "codec": "none", "topics": [["t", 0, 1, 5]]}, b"1234", "do not add up"),
        (
            {"seq": 1, "codec": "none", "topics": [["t", -1, 1, 4]]},
            b"1234",
            r"'t' first must be within \[0, ",
        ),
        ({"seq": 1, "codec": "none", "topics": [["t", 0, 0, 4]]}, b"1234", r"'t' count must be within \[1, "),
        (
            {"seq": 1, "codec": "none", "topics": [["t", 0, 1, 1001]]},
            b"1234",
            r"'t' size must be within \[1, 1000\]",
        ),
        (
            {"seq": 1, "codec": "none", "topics": [["t", 2**53 - 1, 2, 4]]},
            b"1234",
            "end past 9007199254740992",
        ),
        (
            {"seq": 1.0, "codec": "none", "topics": [["t", 0, 1, 4]]},
            b"1234",
            "seq must be an integer, got 1.0",
        ),
        (
            {"seq": True, "codec": "none", "topics": [["t", 0, 1, 4]]},
            b"1234",
            "seq must be an integer, got True",
        ),
        (
            {"seq": 1, "codec": "none", "topics": [["t", 2**64 + 5, 1, 4]]},
            b"1234",
            "got an integer of 65 bits",
        ),
        ({"seq": 1, "codec": "none", "topics": [[5, 0, 1, 4]]}, b"1234", "must be \\[topic, first"),
        ({"seq": 1, "codec": "lz4", "topics": [["t", 0, 1, 4]]}, b"1234", "unknown codec"),
        ({"seq": 1, "codec": "zlib", "topics": [["t", 0, 1, 4]]}, b"1234", "does not decompress"),
        ({"codec": "none", "topics": []}, b"", "bad batch header"),
        ({"seq": 1, "codec": "none", "topics": [["t", 0]]}, b"", "bad batch header"),
        ({"seq": 1, "codec": "none", "topics": [], "site_ends": {"t": 3}}, b"", "bad batch header"),
        ({"seq": 1, "codec": "none", "topics": [], "site_oldest": {"t": -1}}, b"", "site_oldest of 't'"),
        ({"seq": 1, "codec": "none", "topics": [], "site_oldest": [5]}, b"", "site_oldest must be an object"),
    ],
)
def test_a_bad_batch_is_refused(header: dict, body: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        decode_batch(decode(encode(BATCH, header, body)), limit=1000)


def test_zlib_stops_inflating_at_the_limit() -> None:
    bomb = zlib.compress(b"\0" * 1_000_000)
    message = decode(encode(BATCH, {"seq": 0, "codec": "zlib", "topics": [["t", 0, 1, 1000]]}, bomb))
    with pytest.raises(WireError, match="past 1000"):
        decode_batch(message, limit=1000)


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (b'{"seq":1e400}', "seq must be an integer, got inf"),
        (b'{"seq":NaN}', "NaN is not a number here"),
        (b'{"seq":-Infinity}', "-Infinity is not a number here"),
        (b'{"seq":' + b"9" * 5000 + b"}", "header is not JSON"),
    ],
)
def test_a_number_json_cannot_give_as_an_integer_is_refused_by_name(header: bytes, why: str) -> None:
    data = bytes([BATCH]) + len(header).to_bytes(4, "big") + header
    with pytest.raises(WireError, match=why):
        decode_batch(decode(data), limit=1000)


def test_ends_and_seq_of_the_hub_are_offsets_and_integers() -> None:
    assert ends_of({"a": 0, "b": 2**53}, "ends") == {"a": 0, "b": 2**53}
    for bad in ({"a": -1}, {"a": 2**53 + 1}, {"a": 1.5}, {"a": "3"}, {"a": None}, [1]):
        with pytest.raises(WireError):
            ends_of(bad, "ends")
    assert seq_of(7) == 7
    for bad_seq in (-1, 2.0, False, "7", None, float("inf")):
        with pytest.raises(WireError, match="seq"):
            seq_of(bad_seq)


def test_the_hubs_ends_go_in_pages_that_fit_what_the_site_takes() -> None:
    ends = {f"site/dev-{n:05d}/temp": n for n in range(1000)}
    pages = list(ends_pages(ends, 5000, 2048))
    assert len(pages) > 10
    assert [page.get("more", False) for page in pages] == [True] * (len(pages) - 1) + [False]
    assert all(len(encode(ENDS, page)) <= 2048 + 100 for page in pages)
    assert {topic: end for page in pages for topic, end in page["ends"].items()} == ends
    assert list(ends_pages(ends, 5000, None)) == [{"ends": ends, "max_message_bytes": 5000}]
    assert [page["ends"] for page in ends_pages({"t": 1, "u": 2}, 5000, 1)] == [{"t": 1}, {"u": 2}]


@pytest.mark.parametrize("name", ["température/capteur-{}", "sensor/\U0001f321-{}", 'a"quoted\\name\t{}'])
def test_pages_of_ends_fit_whatever_characters_the_topics_hold(name: str) -> None:
    ends = {name.format(n): n for n in range(300)}
    pages = list(ends_pages(ends, 5000, 1024))
    assert all(len(encode(ENDS, page)) <= 1024 + 100 for page in pages)
    assert {topic: end for page in pages for topic, end in page["ends"].items()} == ends
