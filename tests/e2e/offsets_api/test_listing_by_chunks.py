"""A listing of many logs is made and sent a chunk at a time, so the event loop is served between chunks.

Structural, not timed: the answer to `GET /v1/logs` over 3 chunks' worth of logs comes in HTTP chunks (one
write per chunk of `LIST_CHUNK` logs, with the loop served after each), never as one body built whole, and
it still parses as the whole listing.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from broker_edge.offsets_api.server import LIST_CHUNK
from broker_edge.storage import LogStore
from tests.e2e.offsets_api.api_harness import ApiHarness, sample_record

LOGS = 3 * LIST_CHUNK + 5


async def _fill(store: LogStore) -> None:
    record = sample_record(1)
    for number in range(LOGS):
        store.append(f"fleet/{number:05d}/status", record)
    await store.wait_durable()


def _chunked_body(port: int, target: str) -> tuple[bytes, list[bytes]]:
    """The response's head and its body's HTTP chunks, read from a raw socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while more := sock.recv(1 << 16):
            data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    chunks: list[bytes] = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if not size:
            return head, chunks
        chunks.append(rest[:size])
        rest = rest[size + 2 :]


def test_a_long_listing_is_sent_a_chunk_of_logs_at_a_time(tmp_path: Path):
    harness = ApiHarness(tmp_path / "store")
    try:
        harness.run(_fill(harness.store))

        head, chunks = _chunked_body(harness.port, "/v1/logs")
    finally:
        harness.close()

    assert b"transfer-encoding: chunked" in head.lower()
    assert len(chunks) >= LOGS // LIST_CHUNK
    assert max(map(len, chunks)) < 200 * LIST_CHUNK  # a chunk of logs per write, never the whole listing
    logs = json.loads(b"".join(chunks))["logs"]
    assert [log["topic"] for log in logs] == [f"fleet/{number:05d}/status" for number in range(LOGS)]
