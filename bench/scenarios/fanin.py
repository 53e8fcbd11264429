"""Fan-in: 4 publishers on 4 topics, one subscriber on the wildcard, QoS 0 and QoS 1."""

from __future__ import annotations

from bench.loadgen.flow import FlowSpec
from bench.scenarios.base import RunContext, ScenarioResult, ratio_target
from bench.scenarios.throughput import COLUMNS, IN_FLIGHT_AND_TCP, flow_row

PUBLISHERS = 4
PAYLOAD = 64
#: publishers may run this many messages ahead of the subscriber (bounds every broker's queue)
AHEAD = 10_000


def spec(qos: int, publishers: int = PUBLISHERS) -> FlowSpec:
    """The fan-in flow at one QoS."""
    return FlowSpec(
        publishers=publishers,
        subscribers=1,
        qos=qos,
        topics=tuple(f"bench/fanin/{i}" for i in range(publishers)),
        subscription="bench/fanin/+",
        payload_size=PAYLOAD,
        window=64,
        ahead=AHEAD,
    )


def run(ctx: RunContext) -> ScenarioResult:
    """Measure fan-in for every broker at QoS 0 and QoS 1."""
    rows = [flow_row(ctx, broker, f"QoS {qos}", spec(qos)) for qos in (0, 1) for broker in ctx.brokers]
    result = ScenarioResult(
        key="fanin",
        title="Fan-in: 4 publishers → 1 subscriber",
        description=(
            f"{PUBLISHERS} publishers, each on its own topic `bench/fanin/<i>`, one subscriber on "
            f"`bench/fanin/+`, {PAYLOAD}-byte payloads. QoS 1 publishers keep up to 64 PUBLISHes "
            "unacknowledged; the subscriber subscribes at the same QoS and PUBACKs every delivery. "
            f"Publishers stay at most {AHEAD:,} messages ahead of the subscriber. Figure: messages/s "
            "delivered to the subscriber. Timestone runs its default configuration, in which QoS 1 "
            "messages are appended to the commitlog (group commit) before the PUBACK; the persisted "
            "scenario below also shows it with persistence off." + IN_FLIGHT_AND_TCP
        ),
        figure_name="delivered/s",
        higher_is_better=True,
        columns=COLUMNS,
        rows=rows,
    )
    for qos in (0, 1):
        result.targets.append(
            ratio_target(
                f"fan-in QoS {qos} ≥ 50% of Mosquitto's",
                result.figure(f"QoS {qos}", "timestone"),
                result.figure(f"QoS {qos}", "mosquitto"),
                0.5,
            )
        )
    return result
