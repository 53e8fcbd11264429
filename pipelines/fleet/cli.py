"""``timestone devices simulate``: run a simulated fleet against one or more brokers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time

from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import Fleet, FleetSpec


def _broker_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timestone devices", description="Simulated device fleets.")
    sub = parser.add_subparsers(dest="action", required=True)
    simulate = sub.add_parser("simulate", help="connect N simulated devices and keep them running")
    simulate.add_argument("--count", type=int, default=10, help="number of devices (default 10)")
    simulate.add_argument(
        "--broker",
        type=_broker_address,
        action="append",
        help="HOST:PORT, repeatable (default 127.0.0.1:1883)",
    )
    simulate.add_argument("--groups", default="canary,fleet", help="comma-separated groups, assigned in turn")
    simulate.add_argument("--id-prefix", default="dev")
    simulate.add_argument("--firmware", default="1.0.0", help="firmware version the devices start with")
    simulate.add_argument("--telemetry-interval", type=float, default=5.0, help="seconds between readings")
    simulate.add_argument("--download-delay", type=float, nargs=2, default=(0.5, 2.0), metavar=("MIN", "MAX"))
    simulate.add_argument("--failure-rate", type=_rate, default=0.0)
    simulate.add_argument("--reject-rate", type=_rate, default=0.0)
    simulate.add_argument("--offline-rate", type=float, default=0.0, help="disconnects per device per minute")
    simulate.add_argument("--duration", type=float, default=0.0, help="seconds to run (0 = until Ctrl-C)")
    simulate.add_argument("--seed", type=int, default=7)
    return parser


async def _simulate(args: argparse.Namespace) -> int:
    spec = FleetSpec(
        brokers=args.broker or [("127.0.0.1", 1883)],
        count=args.count,
        id_prefix=args.id_prefix,
        groups=[g for g in args.groups.split(",") if g],
        seed=args.seed,
    )
    behaviour = DeviceBehaviour(
        firmware=args.firmware,
        telemetry_interval_s=args.telemetry_interval,
        download_delay_s=tuple(args.download_delay),
        failure_rate=args.failure_rate,
        reject_rate=args.reject_rate,
        offline_rate_per_min=args.offline_rate,
    )
    fleet = Fleet(spec, behaviour)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    await fleet.start()
    print(f"{fleet.connected()} devices connected to {', '.join(f'{h}:{p}' for h, p in spec.brokers)}")
    deadline = time.monotonic() + args.duration if args.duration else None
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 5.0)
        print(
            f"connected={fleet.connected()} " + " ".join(f"{k}={v}" for k, v in sorted(fleet.stats.items()))
        )
    await fleet.stop()
    return 0


def devices_main(argv: list[str]) -> int:
    """Entry point of ``timestone devices``."""
    args = build_parser().parse_args(argv)
    return asyncio.run(_simulate(args))
