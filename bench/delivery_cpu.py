"""A QoS 1 subscriber's deliveries in process: held behind its full window, then sent as its PUBACKs come.

    .venv/bin/python -m bench.delivery_cpu [--passes 15] [--json]
    cd OTHER_CHECKOUT && PYTHONPATH=. python THIS_CHECKOUT/bench/delivery_cpu.py --json   # another checkout

The delivery side of the QoS 1 fan-in alone, on a real ``BrokerCore`` driven by hand (``engine_cpu``'s): one
MQTT 3.1.1 subscriber of ``plant/#`` at QoS 1 (64 in flight, its queue as large as the socket benches'
broker allows) is given 6,400 logged QoS 1 messages of 16 publishers (64-byte payloads) routed as the durable
batch routes them, in runs of 16 of one publisher (``engine.publish_run.LoggedRun``): after the first 64 the
window is full and the rest are held. Then the subscriber acknowledges everything in flight, a read of
PUBACKs at a time, until nothing is left. Two figures, CPU µs per message, the least and the median of
``--passes`` passes after one warm-up:

- ``held``: routing the runs (the match, each message held in the queue, its encoding cut from its frame);
- ``refill``: the PUBACK reads (decoded, the in-flight entries ended) and the window refilled from the queue
  (packet ids, the deliveries written to the connection's batch, taken at the end of each turn).

No socket, no decoding of PUBLISHes, no log: what the broker spends per message on a QoS 1 subscriber beyond
what a QoS 0 one costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.engine_cpu import Adapter, tune_collector_as_the_broker_does
from broker_edge.engine.message import Message
from broker_edge.engine.publish_run import LoggedRun
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_3_1_1, Connect, Publish, Subscribe, Subscription
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, make_core
from tests.unit.broker_edge.engine.stand_ins import MemoryLog, NullTransport

MESSAGES = 6_400
RUN = 16
PUBLISHERS = 16


def setup() -> tuple[HandDrivenCore, Any]:
    """A broker logging QoS 1 in memory, and its subscriber's connection (``plant/#`` at QoS 1)."""
    core = make_core(limits={"messages_per_second_per_client": 0, "max_offline_messages": 100_000})

    def durable_soon(callback: Callable[[], object]) -> None:
        def durable() -> None:
            callback()

        core.call_soon(durable)

    core.publish_path.attach_store(MemoryLog(durable_soon=durable_soon), None)
    conn = Adapter(core, core.listener)
    conn.attach_transport(NullTransport())
    conn.data_received(
        encode(Connect(client_id="sub", protocol_version=MQTT_3_1_1, keep_alive=0), MQTT_3_1_1)
    )
    core.run_soon()
    conn.data_received(encode(Subscribe(1, [Subscription("plant/#", 1)]), MQTT_3_1_1))
    core.run_soon()
    return core, conn


FRAMES = [
    encode(Publish(f"plant/meter-{n // RUN % PUBLISHERS}", b"x" * 64, 1, packet_id=n + 1), MQTT_3_1_1)
    for n in range(MESSAGES)
]
PUBACKS = [b"\x40\x02" + packet_id.to_bytes(2, "big") for packet_id in range(65_536)]


def one_pass(core: HandDrivenCore, conn: Any) -> tuple[float, float]:
    """CPU µs per message of holding the runs, then of the refills."""
    messages = [
        Message(f"plant/meter-{n // RUN % PUBLISHERS}", b"x" * 64, 1, False, None, "p", n, None, frame)
        for n, frame in enumerate(FRAMES)
    ]
    runs = [LoggedRun(messages[start : start + RUN]) for start in range(0, MESSAGES, RUN)]
    router = core.router
    began = time.process_time()
    for run in runs:
        router.publish_run(run)
    held = time.process_time() - began
    for message in messages:
        message.frame = None  # routed: let go of, as the durable batch does
    core.run_soon()
    session = conn.session
    sent = sum(core.listener.stats.sent)
    began = time.process_time()
    while session.inflight:
        conn.data_received(b"".join([PUBACKS[packet_id] for packet_id in session.inflight]))
        core.run_soon()
    refill = time.process_time() - began
    if sum(core.listener.stats.sent) - sent != MESSAGES - 64:
        raise SystemExit("not every held message was sent: the figures would measure nothing")
    return held / MESSAGES * 1e6, refill / MESSAGES * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="one JSON object of figures on stdout")
    args = parser.parse_args()
    tune_collector_as_the_broker_does()
    core, conn = setup()
    one_pass(core, conn)  # warm-up
    gc.collect()
    passes = [one_pass(core, conn) for _ in range(args.passes)]
    figures = {
        f"{name} {kind}": round(pick([p[index] for p in passes]), 3)
        for index, name in enumerate(("held", "refill"))
        for kind, pick in (("least", min), ("median", statistics.median))
    }
    if args.json:
        print(json.dumps(figures))
    else:
        for name, figure in figures.items():
            print(f"{name}: {figure:.3f} µs CPU per message")


if __name__ == "__main__":
    main()
