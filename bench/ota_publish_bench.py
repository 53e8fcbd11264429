"""The explicit-id publish alone: one message per device topic, from the actions job's publisher to a broker.

    flock /tmp/timestone-heavy.lock .venv/bin/python bench/ota_publish_bench.py --topics 10000 [--devices N]

A broker process and the job's ``MqttPublisher`` (its connections and windows, as in the job), without Spark:
``--rounds`` bursts of one QoS 1 publish on each of ``--topics`` device topics (``actions/devices/<id>``),
the first *cold* (every topic's log is created by it), the others *warm*, each timed from the first PUBLISH
to the last PUBACK. With ``--devices N`` a simulated fleet of N devices is connected first (each subscribed
to its own action topic from its held offset, as devices are; telemetry every ``--telemetry-interval``
seconds), so that the burst is also routed; without it the burst is only logged. ``--profile FILE`` runs
the broker under cProfile (its figures then carry the profiler's overhead: use it to see where the time
goes, not how long it takes); ``--strace`` counts the broker's file system calls during the bursts.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.ota_bench import broker_limits  # noqa: E402
from bench.sysinfo import cpu_seconds  # noqa: E402
from broker_edge.runtime.launcher import BrokerProcess  # noqa: E402
from pipelines.actions.publisher import MqttPublisher, Outgoing  # noqa: E402
from pipelines.fleet.device import DeviceBehaviour  # noqa: E402
from pipelines.fleet.fleet import FleetSpec  # noqa: E402
from pipelines.fleet.processes import FleetProcesses, loopback_sources, raise_open_files_limit  # noqa: E402

SYSCALLS = "fdatasync,fsync,syncfs,openat,close,pwritev,pwrite64,mkdir"
SYNCS = "fdatasync,fsync,syncfs"


class ProfiledBroker(BrokerProcess):
    """A broker process run under cProfile (its stats written to ``profile`` when it stops)."""

    def __init__(
        self, directory: Path, profile: str | None, syncs: str | None = None, **sections: Any
    ) -> None:
        super().__init__(directory, **sections)
        self.profile = profile
        self.syncs = syncs

    def start(self, timeout_s: float = 30.0) -> BrokerProcess:
        if self.profile is None and self.syncs is None:
            return super().start(timeout_s)
        command = [sys.executable]
        if self.syncs is not None:  # seccomp: only the traced calls stop the broker
            command = ["strace", "-f", "-qq", "--seccomp-bpf", "-T", "-tt", "-e", f"trace={SYNCS}"]
            command += ["-e", "signal=none", "-o", self.syncs, sys.executable]
        if self.profile is not None:
            command += ["-m", "cProfile", "-o", self.profile]
        command += ["-m", self.module, "broker", "--config", str(self.config_path)]
        from broker_edge.runtime.launcher import wait_for_port

        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, timeout_s=timeout_s)
        return self

    @property
    def pid(self) -> int:
        """The broker's own process (under strace, the child strace started)."""
        assert self.process is not None
        if self.syncs is None:
            return self.process.pid
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return int(children[0])

    def stop(self) -> None:
        if self.syncs is not None and self.process is not None and self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)  # the broker shuts down cleanly; strace then ends
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        super().stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=0, help="simulated devices subscribed (0: none)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--telemetry-interval", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="run the broker under cProfile, stats to this file")
    parser.add_argument("--strace", action="store_true", help="count the broker's file system calls")
    parser.add_argument("--syncs", help="log the broker's syncs with their times to this file (strace)")
    parser.add_argument(
        "--set", action="append", default=[], help="storage option, e.g. syncfs_min_segments=0"
    )
    args = parser.parse_args(argv)
    raise_open_files_limit()
    workdir = Path(tempfile.mkdtemp(prefix="timestone-ota-publish-"))
    storage: dict[str, object] = {}
    for item in args.set:
        key, _, value = item.partition("=")
        storage[key] = int(value) if value.lstrip("-").isdigit() else value
    sections: dict[str, object] = {
        "limits": broker_limits(max(args.devices, 100)),
        "logging": {"level": "WARNING"},
    }
    if storage:
        sections["storage"] = storage
    broker = ProfiledBroker(workdir / "broker", args.profile, args.syncs, **sections)
    broker.start()
    fleet = None
    tracer = None
    try:
        spec = FleetSpec(
            brokers=[broker.address],
            count=max(args.devices, args.topics),
            connects_per_second=2000.0,
            source_addresses=loopback_sources(max(args.devices, 1)),
        )
        if args.devices:
            behaviour = DeviceBehaviour(
                telemetry_interval_s=args.telemetry_interval, download_delay_s=(0.5, 1.5)
            )
            fleet_spec = FleetSpec(
                brokers=[broker.address],
                count=args.devices,
                connects_per_second=2000.0,
                source_addresses=loopback_sources(args.devices),
            )
            fleet = FleetProcesses(fleet_spec, behaviour, args.procs)
            started = time.monotonic()
            fleet.start()
            print(f"{fleet.status()[0]} devices connected in {time.monotonic() - started:.1f} s", flush=True)
        publisher = MqttPublisher([broker.address])
        assert broker.process is not None
        if args.strace:
            tracer = subprocess.Popen(
                ["strace", "-f", "-c", "-e", f"trace={SYSCALLS}", "-p", str(broker.process.pid)],
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(1.0)
        ids = [spec.device_id(i) for i in range(args.topics)]
        for number in range(args.rounds):
            payload = f'{{"action_id":"bench-{number}","kind":"command","command":"noop"}}'.encode()
            messages = [Outgoing(f"actions/devices/{device_id}", payload) for device_id in ids]
            cpu_before = cpu_seconds(broker.pid)
            started, started_at = time.monotonic(), time.time()
            publisher.publish_many(messages)
            wall = time.monotonic() - started
            cpu = cpu_seconds(broker.pid) - cpu_before
            label = "cold" if number == 0 else "warm"
            at = time.strftime("%H:%M:%S", time.gmtime(started_at))
            print(
                f"round {number} ({label}) {at}: {len(messages)} publishes acknowledged in {wall:.2f} s "
                f"({len(messages) / wall:,.0f}/s), broker CPU {cpu:.2f} s "
                f"({cpu / wall * 100:.0f} % of a core), "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            time.sleep(2.0)
        publisher.close()
    finally:
        if tracer is not None:
            tracer.terminate()
            _, err = tracer.communicate(timeout=30)
            print(re.sub(r"\n\s*\n", "\n", err))
        if fleet is not None:
            fleet.stop()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
