"""Aedes (the Node.js MQTT broker from npm), run by Node with a small launcher script.

`.ci/system-deps` installs it from the lock file in `bench/brokers/aedes/` (as it installs MQTT.js for the
interop tests), with aedes-persistence-level and level (LevelDB, prebuilt for Linux x64); `launch.mjs` there
starts it on a loopback port with its default in-memory persistence or with its LevelDB one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from bench.brokers.base import BrokerUnavailable, BrokerUnderTest

PACKAGE_DIR = Path(__file__).resolve().parent / "aedes"
LAUNCHER = PACKAGE_DIR / "launch.mjs"


class Aedes(BrokerUnderTest):
    """Aedes 1.x with Node's default TCP options and its in-memory persistence (nothing on disk), or with
    `persistence=True` aedes-persistence-level: subscriptions, retained messages and the QoS 1 messages
    owed to subscribers in a LevelDB database in the data directory."""

    name = "aedes"

    def __init__(self, node: str | None = None, tcp_nodelay: bool = False, persistence: bool = False) -> None:
        self.node = node or shutil.which("node") or "node"
        self.tcp_nodelay = tcp_nodelay
        self.persistence = persistence

    def with_tcp_nodelay(self) -> Aedes:
        return Aedes(self.node, tcp_nodelay=True, persistence=self.persistence)

    @property
    def label(self) -> str:
        return "aedes (LevelDB persistence)" if self.persistence else "aedes"

    @property
    def persists(self) -> bool:
        return self.persistence

    @property
    def config_key(self) -> tuple[str, ...]:
        return (self.name, "nodelay" if self.tcp_nodelay else "default", "level" if self.persistence else "")

    def prepare(self) -> None:
        if shutil.which(self.node) is None:
            raise BrokerUnavailable(f"`{self.node}` not found (Debian package `nodejs`)")
        packages = ("aedes", "aedes-persistence-level", "level") if self.persistence else ("aedes",)
        for package in packages:
            if not (PACKAGE_DIR / "node_modules" / package).is_dir():
                raise BrokerUnavailable(
                    f"{package} is not installed in {PACKAGE_DIR} (bash .ci/system-deps does it)"
                )

    def command(self, port: int, workdir: Path) -> list[str]:
        command = [self.node, str(LAUNCHER), str(port), "nodelay" if self.tcp_nodelay else "default"]
        return command + (["level", str(workdir / "data" / "leveldb")] if self.persistence else ["memory"])

    @property
    def summary(self) -> str:
        tcp = "TCP_NODELAY" if self.tcp_nodelay else "Nagle on (default)"
        return f"no in-flight limit, {tcp}, {'LevelDB' if self.persistence else 'in memory'}"

    def config_notes(self) -> str:
        persistence = (
            "aedes-persistence-level on a LevelDB database (level) in its data directory"
            if self.persistence
            else "in-memory persistence aedes-persistence"
        )
        return (
            f"Aedes.createBroker() with its defaults ({persistence}, concurrency "
            "100, no limit on QoS 1 messages in flight to a subscriber), served by net.createServer with "
            + ("noDelay: true" if self.tcp_nodelay else "Node's default TCP options (Nagle on)")
            + "; Node "
            + self._node_version()
        )

    def version(self) -> str:
        try:
            package = json.loads((PACKAGE_DIR / "node_modules" / "aedes" / "package.json").read_text())
        except (OSError, ValueError):
            return "not installed"
        return str(package.get("version", "unknown"))

    def _node_version(self) -> str:
        try:
            return subprocess.run(
                [self.node, "--version"], capture_output=True, text=True, timeout=5, check=False
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
