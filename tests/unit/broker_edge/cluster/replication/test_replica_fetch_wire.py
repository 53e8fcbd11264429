"""The replica fetch wire format: round trips, and malformed input refused with the field named."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from broker_edge.cluster.replication.replica_fetch import (
    DIVERGING,
    FRAMES,
    NOT_LEADER,
    OK,
    RESTART,
    FetchRequest,
    FetchResponse,
    PartitionData,
    PartitionFetch,
    TopicData,
    TopicPosition,
    WireError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)


def _request() -> FetchRequest:
    return FetchRequest(
        "b2",
        77,
        False,
        500,
        4 << 20,
        1 << 20,
        [
            PartitionFetch(3, 9, [TopicPosition("plant/ä/temp", 12, 9), TopicPosition("x", 0, -1)]),
            PartitionFetch(5, 2),
        ],
    )


def test_a_request_round_trips() -> None:
    request = _request()
    assert decode_request(encode_request(request)) == request
    observer = FetchRequest("b9", 0, True, 0, 1, 1)
    assert decode_request(encode_request(observer)) == observer


def test_a_response_round_trips_with_frames_divergence_and_restart() -> None:
    response = FetchResponse(
        77,
        OK,
        [
            PartitionData(
                3,
                OK,
                9,
                [
                    TopicData("a", FRAMES, 10, 0, [(8, 0), (9, 7)], first=5, count=3, frames=[b"abc", b"de"]),
                    TopicData("b", DIVERGING, 4, 0, diverging_epoch=7, diverging_end=4),
                    TopicData("c", RESTART, 100, 90, [(4, 80)]),
                    TopicData("d", FRAMES, 3, 0, first=3),
                ],
            ),
            PartitionData(5, NOT_LEADER, 3),
        ],
    )
    decoded = decode_response(b"".join(encode_response(response)))
    assert decoded.partitions[0].topics[0].frames == [b"abcde"]
    decoded.partitions[0].topics[0].frames = [b"abc", b"de"]
    assert decoded == response


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda data: data[:-3], "ends inside partition"),
        (lambda data: data + b"\0", "bytes after its end"),
        (lambda data: b"\x07" + data[1:], "version 7"),
    ],
)
def test_malformed_requests_are_refused_naming_the_field(mangle, message) -> None:
    with pytest.raises(WireError, match=message):
        decode_request(mangle(encode_request(_request())))


BEYOND = 2**63 - 1
"""An offset the wire carries (u64) that no log holds (``broker_edge.bounds.MAX_OFFSET`` is 2**53)."""


def test_a_request_for_an_offset_no_log_holds_is_refused_naming_the_topic() -> None:
    request = FetchRequest("b2", 0, False, 0, 1, 1, [PartitionFetch(3, 9, [TopicPosition("t", BEYOND, 9)])])
    with pytest.raises(WireError, match=f"'t' offset {BEYOND} is past what a log holds"):
        decode_request(encode_request(request))


@pytest.mark.parametrize(
    ("topic", "named"),
    [
        (TopicData("t", FRAMES, BEYOND, 0), "high watermark"),
        (TopicData("t", RESTART, 10, BEYOND), "start offset"),
        (TopicData("t", RESTART, 10, 0, [(4, BEYOND)]), "epoch boundary"),
        (TopicData("t", FRAMES, 10, 0, first=BEYOND, count=1, frames=[b"x"]), "end of frames"),
        (TopicData("t", FRAMES, 10, 0, first=2**53, count=1, frames=[b"x"]), "end of frames"),
        (TopicData("t", DIVERGING, 4, 0, diverging_epoch=7, diverging_end=BEYOND), "divergence"),
    ],
)
def test_a_leader_answering_an_offset_no_log_holds_is_refused_naming_it(topic: TopicData, named: str) -> None:
    response = FetchResponse(1, OK, [PartitionData(3, OK, 9, [topic])])
    with pytest.raises(WireError, match=f"'t' {named} .* is past what a log holds"):
        decode_response(b"".join(encode_response(response)))


def test_an_empty_replica_or_zero_limits_are_refused() -> None:
    with pytest.raises(WireError, match="replica"):
        decode_request(encode_request(FetchRequest("", 0, False, 0, 1, 1)))
    with pytest.raises(WireError, match="max_bytes"):
        decode_request(encode_request(FetchRequest("b1", 0, False, 0, 0, 1)))


def test_a_fetch_its_replica_drops_before_its_body_arrived_is_logged_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A replica whose fetcher is replaced (its view changed) drops the fetch it was sending: the leader
    notes it at DEBUG, not as a failed request with a traceback."""
    from aiohttp import web

    from broker_edge.cluster.replication.replica_fetch import CONTENT_TYPE, PATH, replica_fetch_route
    from broker_edge.offsets_api.server import authentication, json_errors
    from broker_edge.security.access import member_access

    async def serve(request: FetchRequest) -> FetchResponse:
        raise AssertionError("no request is complete")

    async def main() -> None:
        middlewares: list[Any] = [json_errors, authentication(lambda _r: member_access("b2"))]
        app = web.Application(middlewares=middlewares)
        replica_fetch_route(serve)(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = f"POST {PATH} HTTP/1.1\r\nHost: leader\r\nContent-Type: {CONTENT_TYPE}\r\n"
            writer.write((head + "Content-Length: 1000\r\n\r\n").encode() + b"x" * 10)
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.close()  # the rest of the body never comes
            await asyncio.sleep(0.2)
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []
    gone = "closed its connection before its request body arrived"  # (http.guard.read_body says it)
    assert any(gone in record.getMessage() for record in caplog.records)
