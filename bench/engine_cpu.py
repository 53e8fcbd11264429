"""The engine's CPU per publish, in process: no socket, no event loop, no load generator.

    .venv/bin/python -m bench.engine_cpu [--passes 3] [--only fanout,fanin] [--json] [--interpreter-gc]
    cd OTHER_CHECKOUT && PYTHONPATH=. python THIS_CHECKOUT/bench/engine_cpu.py --json   # another checkout

A real ``BrokerCore`` driven by hand (the handler tests' ``wire.py``: a clock, and the end of a loop turn run
by the script), its connections in the transport adapter the broker runs them in, writing to a transport that
drops what it is given. The log is ``MemoryLog`` (appends in memory, durable at the end of the turn), so the
logged path runs whole (accept, persist, durable, replicated, route and answer) without a disk. Each figure
is the process's CPU time (``time.process_time``) per publish over ``--passes`` passes after one warm-up:

- ``fanout``: one MQTT 5 publisher sends 400 reads of 64 QoS 1 PUBLISHes (logged) to 50 QoS 0 subscribers of
  ``plant/#``: 50 deliveries and one PUBACK per publish;
- ``fanin``: 500 MQTT 3.1.1 devices, each on a topic of its own, send one QoS 1 PUBLISH a turn for 40 turns,
  one QoS 0 subscriber of ``plant/#``;
- ``fanin_reads``: 16 MQTT 3.1.1 publishers, each on a topic of its own, send reads of 16 QoS 1 PUBLISHes
  (logged, 64-byte payloads) in turn, 100 turns, one QoS 0 subscriber of ``plant/#``: the socket fan-in's
  shape, where a read brings several publishes of a publisher and a turn's batch acknowledges them together;
- ``fanin_reads_acked``: ``fanin_reads`` with a QoS 1 subscriber acknowledging every delivery at the end of
  each turn while it has some in flight (the kit's fan-in at QoS 1): the in-flight window, the session's
  queue and the PUBACKs that move it;
- ``fanin_member``: ``fanin`` on a cluster member leading every partition (a ``forwarding`` port that appends
  everything here), whose answers keep each publisher's order through the queue a member needs;
- ``fanin_qos0``: 16 MQTT 3.1.1 publishers, each on a topic of its own, send reads of 64 QoS 0 PUBLISHes
  (64-byte payloads) in turn, 100 turns, one QoS 0 subscriber of ``plant/#``;
- ``fanin_qos0_lone``: 500 MQTT 3.1.1 devices, each on a topic of its own, send one QoS 0 PUBLISH (64-byte
  payload) a turn for 40 turns, one QoS 0 subscriber of ``plant/#``: a read of one PUBLISH, no run to share;
- ``fleet``: 10,000 MQTT 3.1.1 devices, each on ``fleet/device-<n>/telemetry``, send one QoS 1 PUBLISH a
  turn for 4 turns, one QoS 0 consumer of ``fleet/+/telemetry``.

The garbage collector is tuned as the broker tunes it once started (``broker_edge.process.gc_tuning``: the
heap so far frozen, a larger young generation), before the scenario's clients connect; with the
interpreter's defaults (``--interpreter-gc``) collections walking the connected clients' objects take a
share of the figures that a running broker does not pay (the fleet's 10,000 devices: about a quarter).

The script imports ``broker_edge`` and ``tests`` from wherever Python finds them, so the same script measures
another checkout when run with that checkout on ``PYTHONPATH`` (before and after a change, taking turns).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from typing import Any

from broker_edge.engine.ports import ClusterPorts
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_3_1_1, MQTT_5, Connect, Publish, Subscribe, Subscription
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, make_core
from tests.unit.broker_edge.engine.stand_ins import HeldForwarding, MemoryLog, NullTransport


def _adapter() -> Any:
    """The connection in its transport adapter, as the broker runs it (in an older checkout, the connection
    was its own asyncio protocol)."""
    try:
        from broker_edge.runtime.transports.stream import StreamConnection

        return StreamConnection
    except ImportError:
        from broker_edge.engine.connection.connection import Connection

        return Connection


Adapter = _adapter()


class LeadsEverything(HeldForwarding):
    """The ``forwarding`` port of a member leading every partition: everything is appended here."""

    def appends_here(self, topic: str) -> bool:
        return True


TRANSPORT = NullTransport()


def connect(core: HandDrivenCore, client_id: str, version: int) -> Any:
    conn = Adapter(core, core.listener)
    conn.attach_transport(TRANSPORT)
    conn.data_received(encode(Connect(client_id=client_id, protocol_version=version, keep_alive=0), version))
    core.run_soon()
    return conn


def broker(member: bool) -> HandDrivenCore:
    unthrottled = {"messages_per_second_per_client": 0, "new_connections_per_second": 0}
    core = make_core(limits={"max_connections": 20_000, **unthrottled})  # as the load generator's brokers

    def durable_soon(callback: Callable[[], object]) -> None:
        def durable() -> None:
            callback()

        core.call_soon(durable)

    core.publish_path.attach_store(MemoryLog(durable_soon=durable_soon), None)
    if member:
        core.join_cluster(ClusterPorts(forwarding=LeadsEverything()))
    return core


def subscribe(core: HandDrivenCore, count: int, version: int) -> None:
    for n in range(count):
        conn = connect(core, f"sub-{n}", version)
        conn.data_received(encode(Subscribe(1, [Subscription("plant/#", 0)]), version))
        core.run_soon()


Scenario = tuple[Callable[[], None], int, HandDrivenCore, int]
"""How to run one pass, its publishes, the broker, the deliveries a pass makes."""


def fanout() -> Scenario:
    core = broker(member=False)
    subscribe(core, 50, MQTT_3_1_1)
    publisher = connect(core, "publisher", MQTT_5)
    reads = []
    for read in range(400):
        frames = [
            encode(
                Publish(f"plant/line-{n % 8}", b"x" * 64, 1, packet_id=1 + (read * 64 + n) % 65_000), MQTT_5
            )
            for n in range(64)
        ]
        reads.append(b"".join(frames))

    def run() -> None:
        for data in reads:
            publisher.data_received(data)
            core.run_soon()

    return run, 400 * 64, core, 400 * 64 * 50


def fanin(member: bool) -> Scenario:
    core = broker(member)
    subscribe(core, 1, MQTT_3_1_1)
    devices = [connect(core, f"meter-{n}", MQTT_3_1_1) for n in range(500)]
    frames = [
        [encode(Publish(f"plant/meter-{n}", b"21.5", 1, packet_id=turn + 1), MQTT_3_1_1) for n in range(500)]
        for turn in range(40)
    ]

    return _turns(core, devices, frames), 40 * 500, core, 40 * 500


def fanin_qos0_lone() -> Scenario:
    core = broker(member=False)
    subscribe(core, 1, MQTT_3_1_1)
    devices = [connect(core, f"meter-{n}", MQTT_3_1_1) for n in range(500)]
    frame = [encode(Publish(f"plant/meter-{n}", b"x" * 64, 0), MQTT_3_1_1) for n in range(500)]

    return _turns(core, devices, [frame] * 40), 40 * 500, core, 40 * 500


def _turns(core: HandDrivenCore, devices: list[Any], frames: list[list[bytes]]) -> Callable[[], None]:
    """One pass: in each turn every device sends its frame of the turn, then the turn ends."""

    def run() -> None:
        for turn in frames:
            for device, data in zip(devices, turn, strict=True):
                device.data_received(data)
            core.run_soon()

    return run


def _turns_of_sixteen_publishers() -> list[list[bytes]]:
    """100 turns, each a read of 16 QoS 1 PUBLISHes (64-byte payloads) of each of 16 publishers."""
    return [
        [
            b"".join(
                encode(Publish(f"plant/meter-{n}", b"x" * 64, 1, packet_id=1 + turn * 16 + k), MQTT_3_1_1)
                for k in range(16)
            )
            for n in range(16)
        ]
        for turn in range(100)
    ]


def fanin_reads() -> Scenario:
    core = broker(member=False)
    subscribe(core, 1, MQTT_3_1_1)
    publishers = [connect(core, f"meter-{n}", MQTT_3_1_1) for n in range(16)]
    reads = _turns_of_sixteen_publishers()
    return _turns(core, publishers, reads), 100 * 16 * 16, core, 100 * 16 * 16


def fanin_reads_acked() -> Scenario:
    """``fanin_reads`` with a QoS 1 subscriber that acknowledges every delivery at the end of each turn, as
    long as the broker has more for it: the in-flight window, its queue and the PUBACKs that move it."""
    core = broker(member=False)
    subscriber = connect(core, "sub-0", MQTT_3_1_1)
    subscriber.data_received(encode(Subscribe(1, [Subscription("plant/#", 1)]), MQTT_3_1_1))
    core.run_soon()
    session = subscriber.session
    publishers = [connect(core, f"meter-{n}", MQTT_3_1_1) for n in range(16)]
    reads = _turns_of_sixteen_publishers()
    pubacks = [b"\x40\x02" + packet_id.to_bytes(2, "big") for packet_id in range(65_536)]

    def run() -> None:
        for turn in reads:
            for publisher, data in zip(publishers, turn, strict=True):
                publisher.data_received(data)
            core.run_soon()
            while session.inflight:
                subscriber.data_received(b"".join([pubacks[packet_id] for packet_id in session.inflight]))
                core.run_soon()

    return run, 100 * 16 * 16, core, 100 * 16 * 16


def fanin_qos0() -> Scenario:
    core = broker(member=False)
    subscribe(core, 1, MQTT_3_1_1)
    publishers = [connect(core, f"meter-{n}", MQTT_3_1_1) for n in range(16)]
    reads = [
        b"".join(encode(Publish(f"plant/meter-{n}", b"x" * 64, 0), MQTT_3_1_1) for _ in range(64))
        for n in range(16)
    ]

    def run() -> None:
        for _ in range(100):
            for publisher, data in zip(publishers, reads, strict=True):
                publisher.data_received(data)
            core.run_soon()

    return run, 100 * 16 * 64, core, 100 * 16 * 64


def fleet() -> Scenario:
    core = broker(member=False)
    consumer = connect(core, "consumer", MQTT_3_1_1)
    consumer.data_received(encode(Subscribe(1, [Subscription("fleet/+/telemetry", 0)]), MQTT_3_1_1))
    core.run_soon()
    devices = [connect(core, f"device-{n}", MQTT_3_1_1) for n in range(FLEET)]
    frames = [
        [
            encode(Publish(f"fleet/device-{n}/telemetry", b"x" * 100, 1, packet_id=turn + 1), MQTT_3_1_1)
            for n in range(FLEET)
        ]
        for turn in range(4)
    ]

    return _turns(core, devices, frames), 4 * FLEET, core, 4 * FLEET


FLEET = 10_000
"""Devices of the ``fleet`` scenario: more topics than a cache of a few thousand holds."""

SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "fanout": fanout,
    "fanin": lambda: fanin(member=False),
    "fanin_reads": fanin_reads,
    "fanin_reads_acked": fanin_reads_acked,
    "fanin_member": lambda: fanin(member=True),
    "fanin_qos0": fanin_qos0,
    "fanin_qos0_lone": fanin_qos0_lone,
    "fleet": fleet,
}


def tune_collector_as_the_broker_does() -> None:
    """The broker's garbage collector settings at start (``gc_tuning``, its defaults); a checkout measured
    that has none keeps the interpreter's defaults."""
    try:
        from broker_edge.process.gc_tuning import RuntimeConfig, tune_garbage_collector
    except ImportError:
        return
    tune_garbage_collector(RuntimeConfig())


def measure(name: str, passes: int, broker_gc: bool = True) -> float:
    """CPU microseconds per publish of scenario ``name`` (a fresh broker, one warm-up pass); with
    ``broker_gc``, the collector tuned as the broker tunes it once started, before the clients connect."""
    if broker_gc:
        tune_collector_as_the_broker_does()
    run, publishes, core, deliveries = SCENARIOS[name]()
    run()
    delivered = sum(core.listener.stats.sent)
    if delivered != deliveries:  # a run held back (a limit, a refusal) would measure nothing
        raise SystemExit(f"{name}: {delivered} deliveries in the warm-up pass, {deliveries} expected")
    gc.collect()
    began = time.process_time()
    for _ in range(passes):
        run()
    return (time.process_time() - began) / (passes * publishes) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--only", help="comma-separated scenarios (default: all)")
    parser.add_argument("--json", action="store_true", help="one JSON object of figures on stdout")
    parser.add_argument(
        "--interpreter-gc",
        action="store_true",
        help="leave the garbage collector as the interpreter sets it (figures before 2026-11-29 were so)",
    )
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(SCENARIOS)
    figures = {name: round(measure(name, args.passes, not args.interpreter_gc), 3) for name in names}
    if args.json:
        print(json.dumps(figures))
    else:
        for name, figure in figures.items():
            print(f"{name}: {figure:.2f} µs CPU per publish")


if __name__ == "__main__":
    main()
