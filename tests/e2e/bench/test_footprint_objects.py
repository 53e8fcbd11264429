"""What a default broker on uvloop keeps per idle MQTT 5 connection, counted by ``bench.footprint_objects``.

A real broker, 500 real client sockets (clean start, keep alive 60 s): the broker's own blocks per
connection are its ``Connection``, its ``Session`` and the client id, within the same budget as the unit
test's; a task, timer, buffer or container made per connection on the way through the real transport would
add a fourth.
"""

from __future__ import annotations

from bench.footprint_objects import measure

CONNECTIONS = 500
OWN_BLOCKS_BYTES = 280
"""The connection (112), the session (96) and a 17-character client id (66), plus a few bytes: one slot
more on the connection or the session would exceed it."""


def test_a_default_broker_keeps_three_objects_per_idle_connection(quiet_broker_log):
    result = measure(CONNECTIONS, "asyncio")
    per_connection = [site for site in result.sites if site.owner == "broker" and site.blocks >= 0.9]
    files = sorted(site.where.rsplit(":", 1)[0] for site in per_connection)
    assert files == [
        "broker_edge/engine/routing/router.py",
        "broker_edge/protocol/wire.py",
        "broker_edge/runtime/transports/tcp.py",
    ], [f"{site.where} {site.block_size} B x {site.blocks:.2f}" for site in per_connection]
    assert sum(site.block_size for site in per_connection) <= OWN_BLOCKS_BYTES
    assert all(0.9 <= site.blocks <= 1.01 for site in per_connection), "one of each per connection"
    assert result.owned_by("event loop") > 1000, "uvloop's transport is counted as the loop's"
