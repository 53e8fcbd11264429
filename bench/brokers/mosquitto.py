"""Mosquitto (the Debian package), started with a generated config on a loopback port."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path

from bench.brokers.base import BrokerUnavailable, BrokerUnderTest

#: QoS 1 messages in flight to one client: the same window as Timestone's `limits.max_inflight_out`
#: and the load generator's publishers (Mosquitto's default is 20)
INFLIGHT = 64
#: the notice Mosquitto logs (at `log_type notice`) when it drops messages owed to a client
DROP_NOTICE = "Outgoing messages are being dropped"
#: the account Debian's Mosquitto switches to when started as root (its `user` option's default)
RUN_AS = "mosquitto"


def mosquitto_binary() -> str | None:
    """The mosquitto executable: on PATH, or where Debian puts it (/usr/sbin is not on every PATH)."""
    found = shutil.which("mosquitto")
    if found:
        return found
    return "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None


def hand_data_dir_to_broker_user(workdir: Path) -> None:
    """Let the `mosquitto` account write `workdir/data` when we run as root.

    Started as root, Mosquitto drops to that account; the 0700 temporary directory would then refuse its
    snapshot (`Permission denied`) and persistence would silently write nothing.
    """
    if os.geteuid() != 0:
        return
    try:
        account = pwd.getpwnam(RUN_AS)
    except KeyError:
        return
    os.chmod(workdir, 0o755)
    os.chown(workdir / "data", account.pw_uid, account.pw_gid)


class Mosquitto(BrokerUnderTest):
    """Mosquitto with anonymous access, no connection limit, a window of 64, and persistence on or off.

    `persistence=None` is the plain configuration (persistence off) of every scenario but the persisted one.
    Its persistence is an in-memory database saved to disk every `autosave_interval` seconds, not a log
    written before the PUBACK: the persisted scenario says so next to its figure.
    """

    name = "mosquitto"

    def __init__(
        self, persistence: bool | None = None, binary: str | None = None, tcp_nodelay: bool = False
    ) -> None:
        self.persistence = persistence
        self.binary = binary or mosquitto_binary() or "mosquitto"
        self.tcp_nodelay = tcp_nodelay

    def with_tcp_nodelay(self) -> Mosquitto:
        return Mosquitto(self.persistence, self.binary, tcp_nodelay=True)

    @property
    def label(self) -> str:
        if self.persistence is None:
            return "mosquitto"
        return "mosquitto (persistence on)" if self.persistence else "mosquitto (persistence off)"

    @property
    def config_key(self) -> tuple[str, ...]:
        return (self.name, "persistence" if self.persistence else "memory", _tcp(self.tcp_nodelay))

    @property
    def summary(self) -> str:
        storage = "snapshot every 1 s" if self.persistence else "persistence off"
        return f"in flight {INFLIGHT}, {_tcp(self.tcp_nodelay)}, {storage}"

    @property
    def persists(self) -> bool:
        return bool(self.persistence)

    def prepare(self) -> None:
        if shutil.which(self.binary) is None:
            raise BrokerUnavailable(f"`{self.binary}` not found (Debian package `mosquitto`)")

    def command(self, port: int, workdir: Path) -> list[str]:
        lines = [
            f"listener {port} 127.0.0.1",
            "allow_anonymous true",
            "max_connections -1",
            f"max_inflight_messages {INFLIGHT}",
            "max_queued_messages 0",
            f"set_tcp_nodelay {'true' if self.tcp_nodelay else 'false'}",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "connection_messages false",
        ]
        if self.persistence:
            hand_data_dir_to_broker_user(workdir)
            lines += ["persistence true", f"persistence_location {workdir / 'data'}/", "autosave_interval 1"]
        else:
            lines.append("persistence false")
        config = workdir / "mosquitto.conf"
        config.write_text("\n".join(lines) + "\n")
        return [self.binary, "-c", str(config)]

    def config_notes(self) -> str:
        notes = (
            f"max_connections -1, max_inflight_messages {INFLIGHT} (default 20), max_queued_messages 0 "
            "(no limit: 2.0.11 counts more against the limit than is outstanding and dropped acknowledged "
            "QoS 1 deliveries even at 100000; the load generator bounds the queue), "
            f"set_tcp_nodelay {'true' if self.tcp_nodelay else 'false (its default: Nagle on)'}, "
            "logging: errors, warnings, notices"
        )
        if self.persistence:
            notes += (
                ", persistence true with autosave_interval 1 (periodic snapshot) in a directory owned by the "
                f"`{RUN_AS}` account it runs as"
            )
        return notes

    def drop_notice(self, log: str) -> str:
        lines = log.count(DROP_NOTICE)
        if not lines:
            return ""
        return f'Mosquitto logged "{DROP_NOTICE}" {lines}x'

    def version(self) -> str:
        try:
            out = subprocess.run(
                [self.binary, "-h"], capture_output=True, text=True, timeout=5, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return "not installed"
        match = re.search(r"mosquitto version (\S+)", out)
        return match.group(1) if match else "unknown"


def _tcp(nodelay: bool) -> str:
    return "TCP_NODELAY" if nodelay else "Nagle on (default)"
