"""A fleet: 10,000 devices, each a connection publishing QoS 1 on its own topic, one consumer on them all.

Every broker runs with persistence on: Timestone's default (QoS 1 appended to the commitlog with group commit
before the PUBACK), Mosquitto's periodic snapshot, Aedes' LevelDB store. The same in-flight window for every
broker: each device keeps at most `WINDOW` PUBLISH unacknowledged (it sends its next reading once the broker
has its last), and the consumer PUBACKs every delivery. A row counts only when the load generator kept up
and every acknowledged message reached the consumer (`throughput.verdict`).
"""

from __future__ import annotations

import dataclasses

from bench.brokers import Aedes, Floor, Mosquitto, Timestone
from bench.brokers.base import BrokerUnderTest
from bench.brokers.floor import ABOUT as FLOOR_ABOUT
from bench.loadgen.flow import FlowSpec, Timing
from bench.scenarios.base import RunContext, ScenarioResult, Target, ratio_target
from bench.scenarios.throughput import flow_row, persisted_result

DEVICES = 10_000
QUICK_DEVICES = 500
#: unacknowledged PUBLISH per device, the same for every broker
WINDOW = 1
#: a JSON reading of about 100 bytes, as devices send
PAYLOAD = 100
#: frames pre-built per device: more than its window, few enough for 10,000 topics in memory
BLOB_FRAMES = 16
CASE = "QoS 1, a topic per device"
#: connecting 10,000 devices on a busy machine takes a while; measuring needs enough seconds to be steady
TIMING = Timing(warmup_s=3.0, measure_s=10.0, drain_s=30.0, connect_timeout_s=240.0)
QUICK_TIMING = Timing(warmup_s=1.0, measure_s=3.0, drain_s=15.0, connect_timeout_s=60.0)


def device_topic(number: int) -> str:
    return f"fleet/device-{number:05}/telemetry"


def spec(devices: int) -> FlowSpec:
    """`devices` publishers, publisher i on device_topic(i), one subscriber on every device's topic."""
    return FlowSpec(
        publishers=devices,
        subscribers=1,
        qos=1,
        topics=tuple(device_topic(n) for n in range(devices)),
        subscription="fleet/+/telemetry",
        payload_size=PAYLOAD,
        window=WINDOW,
        ahead=2 * devices * WINDOW,  # ahead of the consumer: every device's window, twice over
        blob_frames=BLOB_FRAMES,
    )


def variants(ctx: RunContext) -> list[BrokerUnderTest]:
    """Each selected broker with its persistence on; Aedes also with its in-memory default, for scale."""
    names = {b.name for b in ctx.brokers}
    out: list[BrokerUnderTest] = []
    if "timestone" in names:
        out.append(Timestone(persist=True))
    if "mosquitto" in names:
        out.append(Mosquitto(persistence=True))
    if "aedes" in names:
        out += [Aedes(persistence=True), Aedes()]
    if "floor" in names:
        out.append(Floor())
    return out


def run(ctx: RunContext, devices: int = DEVICES) -> ScenarioResult:
    """Measure the fleet against every selected broker, each with persistence on."""
    fleet = spec(devices)
    timed = dataclasses.replace(ctx, timing=QUICK_TIMING if ctx.quick else TIMING)
    brokers = variants(ctx)
    rows = [flow_row(timed, broker, CASE, fleet, data_dir_size=True) for broker in brokers]
    ctx.failures += [f for f in timed.failures if f not in ctx.failures]
    result = persisted_result(
        "fleet",
        f"A fleet: {devices:,} devices, each publishing QoS 1 on its own topic",
        (
            f"{devices:,} connections (devices), device i publishing {PAYLOAD}-byte QoS 1 messages on "
            f"`fleet/device-<i>/telemetry` with at most {WINDOW} unacknowledged (the same window for every "
            "broker), one consumer on `fleet/+/telemetry` at QoS 1 PUBACKing every delivery; the devices "
            f"run at most {fleet.ahead:,} messages ahead of it. Every broker persists: Timestone by default "
            "(QoS 1 appended to the commitlog with group commit before the PUBACK, a log per topic inside "
            "its partition logs), Mosquitto with persistence on (a snapshot of its in-memory store every "
            "second, not a write before the PUBACK), Aedes with aedes-persistence-level (LevelDB: "
            "subscriptions, retained messages and the messages owed to subscribers, not a log of "
            "publishes), and Aedes with its in-memory default for scale. Figure: deliveries/s to the "
            "consumer over the measurement window, which with one "
            "consumer equals the PUBACKs/s of the devices in steady state (both are shown). A row is invalid "
            "when the load generator saturated its CPU or an acknowledged message never reached the consumer."
            + (f" {FLOOR_ABOUT}" if any(isinstance(broker, Floor) for broker in brokers) else "")
        ),
        rows,
    )
    mine = result.figure(CASE, "timestone (persist on)")
    for peer in ("mosquitto (persistence on)", "aedes (LevelDB persistence)", "aedes"):
        goal = f"a fleet of {devices:,} devices on Timestone ≥ 50% of {peer}"
        target = ratio_target(goal, mine, result.figure(CASE, peer), 0.5)
        result.targets.append(target if mine is not None else Target(goal, "not measured", None))
    return result
