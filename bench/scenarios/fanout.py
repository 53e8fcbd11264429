"""Fanout: one publisher, many subscribers on the same topic, QoS 0 and QoS 1."""

from __future__ import annotations

from bench.loadgen.flow import FlowSpec
from bench.scenarios.base import RunContext, ScenarioResult, ratio_target
from bench.scenarios.throughput import COLUMNS, IN_FLIGHT_AND_TCP, flow_row

PAYLOAD = 64
#: the publisher may run this many messages ahead of the average subscriber
AHEAD = 50


def subscribers(ctx: RunContext) -> int:
    """1,000 subscribers (100 in a quick run)."""
    return 100 if ctx.quick else 1000


def spec(qos: int, count: int) -> FlowSpec:
    """The fanout flow at one QoS."""
    return FlowSpec(
        publishers=1,
        subscribers=count,
        qos=qos,
        topics=("bench/fanout",),
        subscription="bench/fanout",
        payload_size=PAYLOAD,
        window=64,
        ahead=AHEAD,
    )


def run(ctx: RunContext) -> ScenarioResult:
    """Measure fanout for every broker at QoS 0 and QoS 1."""
    count = subscribers(ctx)
    rows = [flow_row(ctx, broker, f"QoS {qos}", spec(qos, count)) for qos in (0, 1) for broker in ctx.brokers]
    result = ScenarioResult(
        key="fanout",
        title=f"Fanout: 1 publisher → {count:,} subscribers",
        description=(
            f"One publisher on `bench/fanout`, {count:,} subscribers on the same topic, {PAYLOAD}-byte "
            "payloads, QoS 0 and QoS 1 (64 unacknowledged PUBLISHes at most, every delivery PUBACKed). "
            f"The publisher stays at most {AHEAD} messages ahead of the average subscriber. Figure: "
            "deliveries/s summed over all subscribers." + IN_FLIGHT_AND_TCP
        ),
        figure_name="deliveries/s",
        higher_is_better=True,
        columns=COLUMNS,
        rows=rows,
    )
    for qos in (0, 1):
        result.targets.append(
            ratio_target(
                f"fanout QoS {qos} ≥ Mosquitto's",
                result.figure(f"QoS {qos}", "timestone"),
                result.figure(f"QoS {qos}", "mosquitto"),
                1.0,
            )
        )
    return result
