"""Timestone's edge broker: `timestone broker --config <yaml>` from the project's virtualenv."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from bench.brokers.base import BrokerUnavailable, BrokerUnderTest
from bench.revisions import short_commit

REPO = Path(__file__).resolve().parent.parent.parent


def timestone_executable() -> Path:
    """The `timestone` console script of the interpreter running the benchmark (else the repo's .venv)."""
    beside = Path(sys.executable).parent / "timestone"
    return beside if beside.exists() else REPO / ".venv" / "bin" / "timestone"


class Timestone(BrokerUnderTest):
    """Timestone with one loopback listener and its commitlog in a temporary directory.

    `persist=None` (every scenario but the persisted one) and `persist=True` keep the broker's default
    persistence rules (QoS 1 appended to the log with group commit before the PUBACK); `persist=False` writes
    `storage: {persist: []}`, no topic persisted. Only the label differs between None and True.
    `checkout` runs the broker of another checkout of the project (its directory first on the broker's
    PYTHONPATH, with this virtualenv's interpreter and packages): two versions of the broker side by side.
    """

    name = "timestone"
    start_timeout = 20.0

    def __init__(
        self,
        persist: bool | None = None,
        executable: Path | None = None,
        transport: str | None = None,
        event_loop: str | None = None,
        checkout: Path | None = None,
    ) -> None:
        self.persist = persist
        self.executable = executable or timestone_executable()
        self.transport = transport
        """The listener's ``transport`` (None: the broker's default)."""
        self.event_loop = event_loop
        """``runtime.event_loop`` (None: the broker's default)."""
        self.checkout = checkout.resolve() if checkout else None
        """Another checkout whose broker runs instead of this one's (None: this one)."""

    @property
    def label(self) -> str:
        label = "timestone"
        if self.checkout:
            label += f" ({commit_of(self.checkout) or self.checkout.name})"
        if self.persist is not None:
            label += " (persist on)" if self.persist else " (persist off)"
        label += f" ({self.event_loop} loop)" if self.event_loop else ""
        return label + (f" ({self.transport} transport)" if self.transport else "")

    @property
    def config_key(self) -> tuple[str, ...]:
        return (
            self.name,
            "persist off" if self.persist is False else "default",
            self.transport or "",
            self.event_loop or "",
            str(self.checkout or ""),
        )

    @property
    def summary(self) -> str:
        storage = "nothing persisted" if self.persist is False else "QoS 1 logged, group commit"
        return f"in flight 64, TCP_NODELAY, {storage}"

    @property
    def persists(self) -> bool:
        return self.persist is not False

    def prepare(self) -> None:
        if not self.executable.exists():
            raise BrokerUnavailable(f"{self.executable} does not exist (install the project into its venv)")
        if self.checkout and not (self.checkout / "broker_edge").is_dir():
            raise BrokerUnavailable(f"{self.checkout} is no checkout of the project (no broker_edge/)")

    def env(self) -> dict[str, str] | None:
        if not self.checkout:
            return None
        return {**os.environ, "PYTHONPATH": str(self.checkout)}

    def command(self, port: int, workdir: Path) -> list[str]:
        storage = f"  directory: {workdir / 'data'}\n" + ("  persist: []\n" if self.persist is False else "")
        config = workdir / "timestone.yaml"
        config.write_text(
            f"listeners:\n  - host: 127.0.0.1\n    port: {port}\n"
            + (f"    transport: {self.transport}\n" if self.transport else "")
            + f"storage:\n{storage}"
            + (f"runtime:\n  event_loop: {self.event_loop}\n" if self.event_loop else "")
            # the side ports on free ports, so that runs never collide with another broker on this machine
            + "offsets_api:\n  port: 0\n"
            "admin_http:\n  port: 0\n"
            # the production limits Mosquitto does not have by default: connections and publish rates
            "limits:\n"
            "  max_connections: 1000000\n"
            "  new_connections_per_second: 0\n"
            "  messages_per_second_per_client: 0\n"
            "  max_topics_per_client: 0\n"
            # a subscriber's queue may hold ten times what the load generator lets publishers run ahead;
            # the default 1,000 drops QoS 1 messages of an online subscriber
            "  max_offline_messages: 100000\n"
            "  max_offline_bytes: 104857600\n"
            "logging:\n  level: WARNING\n"
        )
        if self.checkout:  # the console script's interpreter, importing the other checkout's packages
            main = "import sys; from pipelines.cli import main; sys.exit(main())"
            return [str(self.executable.parent / "python"), "-c", main, "broker", "--config", str(config)]
        return [str(self.executable), "broker", "--config", str(config)]

    def config_notes(self) -> str:
        notes = (
            "storage in a temp dir; offsets API and admin HTTP on free ports; limits.max_connections "
            "1000000, new_connections_per_second 0, messages_per_second_per_client 0, "
            "max_topics_per_client 0 (unlimited, as Mosquitto by default); max_offline_messages 100000 and "
            "max_offline_bytes 100 MiB (10x the load generator's window); logging WARNING; rest default: "
            "durability group, receive_maximum 64 and max_inflight_out 64, default TCP options (asyncio's: "
            "TCP_NODELAY on)"
        )
        notes += ", `storage: {persist: []}`" if self.persist is False else ""
        notes += f", runtime.event_loop {self.event_loop}" if self.event_loop else ""
        notes += f", the broker of the checkout at git {commit_of(self.checkout)}" if self.checkout else ""
        return notes + (f", listener transport {self.transport}" if self.transport else "")

    def version(self) -> str:
        try:
            version = importlib.metadata.version("timestone")
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        commit = commit_of(self.checkout or REPO)
        return f"{version} (git {commit})" if commit else version


def commit_of(checkout: Path) -> str:
    """The short commit id of `checkout`'s HEAD ("" when git cannot tell)."""
    try:
        return short_commit("HEAD", checkout, timeout_s=5)
    except (OSError, subprocess.SubprocessError):
        return ""
