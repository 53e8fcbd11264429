"""``timestone devices simulate``: run a simulated fleet against one or more brokers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from pipelines.actions.buckets import DEFAULT_BUCKETS
from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import Fleet, FleetSpec
from pipelines.fleet.processes import (
    PORTS_PER_SOURCE_ADDRESS,
    FleetProcesses,
    loopback_sources,
    raise_open_files_limit,
)
from pipelines.fleet.readings import READING_FORMATS


def broker_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 address in brackets: ``[::1]:1883``), the port 1 to 65535."""
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    if not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {int(port)} in {text!r}")
    return host, int(port)


def _groups(text: str) -> list[str]:
    groups = [group.strip() for group in text.split(",") if group.strip()]
    if not groups:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated group names, got {text!r}")
    for group in groups:
        _topic_level(group)
    return groups


def _topic_level(text: str) -> str:
    """A name that becomes one topic level (a device id's prefix, a group): no '/', '+' or '#'."""
    from pipelines.actions.checks import topic_level

    problem = topic_level(text) if text else None  # an empty prefix gives ids 00000, 00001, ...
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _topic_name(text: str) -> str:
    """``--telemetry-topic``: a topic name once ``{device_id}`` is filled in, which holds no wildcard."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    if "+" in text or "#" in text:
        raise argparse.ArgumentTypeError(f"{text!r}: a topic name holds no '+' or '#'")
    return text


def at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    return value


def more_than_zero(text: str) -> float:
    """A finite number above 0 (an interval, a rate): 0 or NaN would send nothing, or fail later."""
    value = _number(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected more than 0, got {text!r}")
    return value


def zero_or_more(text: str) -> float:
    """A finite number, 0 or more (a duration, a delay, a rate that may be off)."""
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value


def probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text}")
    return value


EXIT_STATUS = (
    "exit status: 0 ran for --duration, or stopped (Ctrl-C, SIGTERM); 1 not one device could connect; "
    "2 a wrong command line"
)

REGISTER_EXIT_STATUS = (
    "exit status: 0 registered; 1 the devices table cannot be written (a full disk, no write permission); "
    "2 a wrong command line or config, or no device given"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timestone devices",
        description="Simulated device fleets, and devices registered in OTA groups.",
        epilog=f"exit status: register: {REGISTER_EXIT_STATUS.removeprefix('exit status: ')}; simulate: "
        f"{EXIT_STATUS.removeprefix('exit status: ')}",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    register = sub.add_parser(
        "register",
        help="register devices in an OTA group, in the devices table, without the telemetry pipeline",
        epilog=REGISTER_EXIT_STATUS,
    )
    register.add_argument("devices", nargs="*", help="device ids")
    register.add_argument("--group", required=True, help="the OTA target group they are in")
    register.add_argument("--from-file", help="a file of device ids, one a line ('-': standard input)")
    register.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag, repeatable")
    register.add_argument(
        "--config", "-c", help="actions YAML (default: conf/actions.yaml if present, else defaults)"
    )
    register.add_argument("--tables-root", help="override the config's tables_root")
    simulate = sub.add_parser(
        "simulate", help="connect N simulated devices and keep them running", epilog=EXIT_STATUS
    )
    simulate.add_argument("--count", type=at_least_one, default=10, help="number of devices (default 10)")
    simulate.add_argument(
        "--broker",
        type=broker_address,
        action="append",
        help="HOST:PORT, repeatable (default 127.0.0.1:1883)",
    )
    simulate.add_argument(
        "--groups",
        type=_groups,
        default="canary,fleet",
        help="comma-separated groups, assigned in turn (default canary,fleet)",
    )
    simulate.add_argument(
        "--id-prefix",
        type=_topic_level,
        default="dev",
        help="device ids are PREFIX-00000, PREFIX-00001, ... (a prefix ending in '-', '_' or '.' is kept as "
        "it is: site1- gives site1-00000; default dev)",
    )
    simulate.add_argument(
        "--buckets",
        type=at_least_one,
        default=DEFAULT_BUCKETS,
        help=f"device buckets of the fleet, as the actions job's device_buckets (default {DEFAULT_BUCKETS})",
    )
    simulate.add_argument(
        "--firmware", default="1.0.0", help="firmware version the devices start with (default 1.0.0)"
    )
    simulate.add_argument(
        "--telemetry-interval", type=more_than_zero, default=5.0, help="seconds between readings (default 5)"
    )
    simulate.add_argument(
        "--download-delay",
        type=zero_or_more,
        nargs=2,
        default=(0.5, 2.0),
        metavar=("MIN", "MAX"),
        help="seconds an OTA takes on a device, drawn between MIN and MAX (default 0.5 2)",
    )
    simulate.add_argument(
        "--failure-rate",
        type=probability,
        default=0.0,
        help="chance that an action a device starts fails (default 0)",
    )
    simulate.add_argument(
        "--reject-rate",
        type=probability,
        default=0.0,
        help="chance that a device rejects an action it receives (default 0)",
    )
    simulate.add_argument(
        "--offline-rate", type=zero_or_more, default=0.0, help="disconnects per device per minute"
    )
    simulate.add_argument(
        "--duration", type=zero_or_more, default=0.0, help="seconds to run (0 = until Ctrl-C)"
    )
    simulate.add_argument(
        "--seed", type=int, default=7, help="of the devices' random choices: the same seed, the same fleet"
    )
    simulate.add_argument(
        "--connects-per-second",
        type=more_than_zero,
        default=150.0,
        help="fleet-wide connection rate (default 150)",
    )
    simulate.add_argument(
        "--procs", type=at_least_one, default=1, help="processes to run the devices in (default 1)"
    )
    simulate.add_argument(
        "--failover",
        action="store_true",
        help="the --broker addresses are members of one cluster: a device whose broker fails moves on",
    )
    simulate.add_argument(
        "--payload",
        choices=(*READING_FORMATS, "sparkplug_b"),
        default="json",
        help="how readings are written (default json); sparkplug_b: --count Sparkplug B edge nodes of "
        "--devices-per-node devices each, in group --group-id",
    )
    simulate.add_argument(
        "--telemetry-topic",
        type=_topic_name,
        default="devices/{device_id}/telemetry",
        help="where readings go, {device_id} the device's id (default devices/{device_id}/telemetry)",
    )
    simulate.add_argument("--devices-per-node", type=at_least_one, default=2, help="sparkplug_b (default 2)")
    simulate.add_argument(
        "--group-id",
        type=_topic_level,
        default="fleet",
        help="sparkplug_b: the Sparkplug group (default fleet)",
    )
    simulate.add_argument(
        "--source-addresses",
        default="auto",
        help="comma-separated local addresses to connect from; auto: one 127.0.0.x per 20,000 devices "
        "when the broker is on loopback",
    )
    return parser


def _source_addresses(text: str, brokers: list[tuple[str, int]], count: int) -> list[str]:
    if text != "auto":
        return [address for address in text.split(",") if address]
    if all(host.startswith("127.") for host, _ in brokers) and count > PORTS_PER_SOURCE_ADDRESS:
        return loopback_sources(count)
    return []


def _fleet(args: argparse.Namespace) -> tuple[FleetSpec, DeviceBehaviour]:
    brokers = args.broker or [("127.0.0.1", 1883)]
    spec = FleetSpec(
        brokers=brokers,
        count=args.count,
        id_prefix=args.id_prefix,
        groups=args.groups,
        buckets=args.buckets,
        seed=args.seed,
        connects_per_second=args.connects_per_second,
        source_addresses=_source_addresses(args.source_addresses, brokers, args.count),
        failover=args.failover,
    )
    behaviour = DeviceBehaviour(
        firmware=args.firmware,
        telemetry_interval_s=args.telemetry_interval,
        download_delay_s=tuple(args.download_delay),
        failure_rate=args.failure_rate,
        reject_rate=args.reject_rate,
        offline_rate_per_min=args.offline_rate,
        payload_format=args.payload,
        telemetry_topic=args.telemetry_topic,
    )
    return spec, behaviour


def _simulate_in_processes(args: argparse.Namespace) -> int:
    """The fleet over ``--procs`` processes; prints progress with the simulator's own CPU use."""
    spec, behaviour = _fleet(args)
    deadline = time.monotonic() + args.duration if args.duration else None
    with FleetProcesses(spec, behaviour, args.procs) as fleet:
        last_cpu, last_time = 0.0, time.monotonic()
        if fleet.status()[0] == 0:  # answered once every process has tried to connect its devices
            print(f"timestone devices simulate: {_nobody(spec)}", file=sys.stderr)
            return NO_DEVICE_CONNECTED
        with contextlib.suppress(KeyboardInterrupt):
            while deadline is None or time.monotonic() < deadline:
                connected, stats, cpu = fleet.status()
                now = time.monotonic()
                share = (cpu - last_cpu) / max(now - last_time, 1e-3) * 100
                last_cpu, last_time = cpu, now
                counters = " ".join(f"{k}={v}" for k, v in sorted(stats.items()))
                print(f"connected={connected} simulator_cpu={share:.0f}% {counters}", flush=True)
                time.sleep(5.0)
    return 0


async def _simulate(args: argparse.Namespace) -> int:
    if args.payload == "sparkplug_b":
        return await _simulate_sparkplug(args)
    spec, behaviour = _fleet(args)
    fleet = Fleet(spec, behaviour)
    nobody = lambda: _nobody(spec, fleet.connect_error)  # noqa: E731
    return await _run(fleet, "devices", spec.brokers, args.duration, nobody)


async def _simulate_sparkplug(args: argparse.Namespace) -> int:
    from pipelines.fleet.sparkplug_node import SparkplugBehaviour, SparkplugFleet  # needs protobuf

    brokers = args.broker or [("127.0.0.1", 1883)]
    sparkplug = SparkplugBehaviour(data_interval_s=args.telemetry_interval)
    nodes = SparkplugFleet(brokers, args.count, args.devices_per_node, args.group_id, sparkplug, args.seed)
    nobody = f"no edge node could connect to {_addresses(brokers)}"
    return await _run(nodes, "Sparkplug B edge nodes", brokers, args.duration, lambda: nobody)


class RunningFleet(Protocol):
    """What :func:`_run` needs of a fleet (devices, or Sparkplug B edge nodes)."""

    stats: Counter

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def connected(self) -> int: ...


async def _run(
    fleet: RunningFleet, noun: str, brokers: list[tuple[str, int]], duration: float, nobody: Callable[[], str]
) -> int:
    """Start the fleet, print its counters every 5 s until ``duration`` (0: a signal), stop it. A signal
    while it connects stops it there (a large fleet takes minutes to connect at its rate)."""
    stop = signal_stop()
    if not await _started_unless_stopped(fleet, stop):
        print(f"stopped while connecting: {fleet.connected()} {noun} were connected", flush=True)
        await fleet.stop()
        return 0
    if fleet.connected() == 0:
        print(f"timestone devices simulate: {nobody()}", file=sys.stderr)
        await fleet.stop()
        return NO_DEVICE_CONNECTED
    print(f"{fleet.connected()} {noun} connected to {_addresses(brokers)}", flush=True)
    deadline = time.monotonic() + duration if duration else None
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 5.0)
        counters = " ".join(f"{k}={v}" for k, v in sorted(fleet.stats.items()))
        print(f"connected={fleet.connected()} {counters}", flush=True)
    await fleet.stop()
    return 0


async def _started_unless_stopped(fleet: RunningFleet, stop: asyncio.Event) -> bool:
    """``fleet.start()``, unless ``stop`` is set first (then the start is cancelled): whether it started."""
    starting = asyncio.ensure_future(fleet.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if starting.done():
        starting.result()
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    return False


def signal_stop() -> asyncio.Event:
    """An event the running loop sets on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    return stop


def _addresses(brokers: list[tuple[str, int]]) -> str:
    return ", ".join(f"{host}:{port}" for host, port in brokers)


NO_DEVICE_CONNECTED = 1
"""Exit status when not one device could connect (the devices would only retry, unseen)."""


RESERVED_FILES = 64
"""Files a simulating process keeps open besides its devices' connections (its loop, pipes, logs)."""


def _nobody(spec: FleetSpec, reason: str | None = None) -> str:
    brokers = ", ".join(f"{host}:{port}" for host, port in spec.brokers)
    return f"no device could connect to {brokers}" + (f" ({reason})" if reason else "")


def devices_main(argv: list[str]) -> int:
    """Entry point of ``timestone devices``."""
    args = build_parser().parse_args(argv)
    if args.action == "register":
        from pipelines.actions.registry import register_main

        return register_main(args)
    low, high = args.download_delay
    if low > high:
        build_parser().error(f"--download-delay: MIN {low} is more than MAX {high}")
    open_files = raise_open_files_limit()
    each = math.ceil(args.count / args.procs)  # a connection each (a device, or a Sparkplug B edge node)
    if each > open_files - RESERVED_FILES:
        build_parser().error(
            f"--count {args.count}: {each} devices in each of --procs {args.procs} processes, where a "
            f"process may have {open_files} files open (ulimit -n), a connection each: run more --procs"
        )
    if args.procs > 1 and args.payload == "sparkplug_b":
        build_parser().error("--payload sparkplug_b runs in one process (--procs 1)")
    if args.procs > 1:
        return _simulate_in_processes(args)
    return asyncio.run(_simulate(args))
