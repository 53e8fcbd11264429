"""Configuration of the actions (OTA fanout) job, loaded from ``conf/actions.yaml``."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker_edge.config import ConfigError
from broker_edge.config.endpoints import BrokerEndpoint


@dataclass
class ActionsConfig:
    """Where the tables and checkpoints live, which brokers to use, how often to act."""

    tables_root: str = ".timestone/tables"
    """Directory (or URI) under which every Delta table lives; on Databricks, a Volume or cloud path."""
    checkpoint_root: str = ".timestone/checkpoints/actions"
    """Spark checkpoints of the job's two streams (actions change feed, device status reports)."""
    brokers: list[BrokerEndpoint] = field(default_factory=lambda: [BrokerEndpoint()])
    cluster: bool | None = None
    """Whether ``brokers`` are members of one cluster: then each action is published once, through any live
    member, and reports are read once. False: separate brokers, each gets every action. None (default):
    ask the brokers when the job starts (``pipelines/actions/cluster.py``)."""
    status_topics: str = "devices/+/actions"
    """Topic filter of the device status reports (docs/device-protocol.md)."""
    trigger_interval_s: float = 1.0
    """Micro-batch interval of both streams."""
    tick_interval_s: float = 1.0
    """How often paced rollouts advance and in-progress timeouts are checked."""
    backend: str = "auto"
    """Table backend: auto (native Delta when the Spark session has it, else delta-rs), delta-rs or native."""

    def __post_init__(self) -> None:
        if not self.brokers:
            raise ConfigError("brokers", "at least one broker is needed")
        for name in ("trigger_interval_s", "tick_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, "must be positive")
        if self.backend not in ("auto", "delta-rs", "native"):
            raise ConfigError("backend", f"expected auto, delta-rs or native, got {self.backend!r}")
