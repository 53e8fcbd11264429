"""Configuration of the actions (OTA fanout) job, loaded from ``conf/actions.yaml``."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker_edge.config import ConfigError
from broker_edge.config.endpoints import BrokerEndpoint
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.topics import validate_topic_filter
from broker_edge.security.client_tls import ClientTls
from pipelines.actions.buckets import DEFAULT_BUCKETS
from pipelines.actions.model import DEFAULT_EXPIRY_S, REPORT_IDENTITIES
from pipelines.maintenance.config import MaintenanceConfig
from pipelines.supervisor import RestartConfig

MAX_EXPIRY_S = 365 * 24 * 3600


@dataclass
class ActionsConfig:
    """Where the tables and checkpoints live, which brokers to use, how often to act."""

    tables_root: str = ".timestone/tables"
    """Directory (or URI) under which every Delta table lives; on Databricks, a Volume or cloud path."""
    checkpoint_root: str = ".timestone/checkpoints/actions"
    """Spark checkpoints of the job's two streams (actions change feed, device status reports)."""
    brokers: list[BrokerEndpoint] = field(default_factory=lambda: [BrokerEndpoint()])
    tls: ClientTls | None = None
    """The CAs the brokers' certificates must chain to (``cafile``; none: the system's) and the job's own
    certificate (``certfile``, ``keyfile``): for ``https://`` offsets APIs, and MQTT to ``mqtt_tls``
    brokers."""
    cluster: bool | None = None
    """Whether ``brokers`` are members of one cluster: then each action is published once, through any live
    member, and reports are read once. False: separate brokers, each gets every action. None (default):
    ask the brokers when the job starts (``pipelines/actions/cluster.py``)."""
    sites: bool = False
    """Whether ``brokers`` are an uplink hub (a broker alone, or the members of a cluster hub) whose devices
    are at the sites (docs/uplink.md): actions are published to the hub (its downlink takes them to every
    site), and reports are read from every site's logs on the hub (``$site/<site_id>/<status topic>``, the
    source's ``sites`` option), not the hub's own."""
    status_topics: str = "actions/reports/+,devices/+/actions"
    """Topic filters of the device status reports, comma-separated (docs/device-protocol.md): each device
    bucket's report topic, and each device's own topic for devices on the earlier protocol."""
    report_identity: str = "client_id"
    """Who a status report may speak for (docs/ota.md, "Who may report for a device"): ``client_id``, only
    the device whose id is the client id of the connection that published it (as the broker recorded it);
    ``payload``, any device the report names (a gateway reporting for the devices behind it)."""
    report_topics_per_task: int = 5_000
    """Report topics one Spark task of the reports stream reads in one fetch (the source's
    ``maxTopicsPerPartition``, at most 10,000): a bucket's report topic brings a few devices' reports per
    batch, so a batch over a large fleet is a few large reads."""
    trigger_interval_s: float = 1.0
    """Micro-batch interval of both streams."""
    tick_interval_s: float = 1.0
    """How often rollouts advance (rates, phases, schedules, windows, retries, devices joining continuous
    actions) and in-progress timeouts are checked."""
    compliance_interval_s: float = 10.0
    """At most how often ``fleet_compliance`` is recomputed (only when a table it is made from changed)."""
    message_expiry_s: int = DEFAULT_EXPIRY_S
    """How long an action message stays valid for a device that has not taken it, seconds (1 s to 365 days;
    its ``expires_at``): a device that comes back later ignores it, and the job ends the execution of a
    device that reported nothing about it ``EXPIRED``, which completes the action without counting as a
    failure (docs/ota.md, "Devices that never take an action")."""
    device_buckets: int = DEFAULT_BUCKETS
    """Buckets of the fleet's devices (``pipelines/actions/buckets.py``; the devices must use the same count):
    an explicit-id action is one message per bucket holding a listed device. 0: one message per device on
    ``actions/devices/<id>`` instead."""
    backend: str = "auto"
    """Table backend: auto (native Delta when the Spark session has it, else delta-rs), delta-rs or native."""
    restart: RestartConfig = field(default_factory=RestartConfig)
    """How a failed query (fanout or reports) is restarted from its checkpoint (pipelines/supervisor.py)."""
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    """Compaction, vacuum and log clean-up of the actions, action_executions and action_summary tables."""

    def __post_init__(self) -> None:
        if not self.brokers:
            raise ConfigError("brokers", "at least one broker is needed")
        if self.tls is not None:
            try:
                self.tls.context()  # files that do not load fail the start naming their key
            except ConfigError as error:
                raise ConfigError(f"tls.{error.path}", error.detail) from None
        first: dict[str, int] = {}
        for index, broker in enumerate(self.brokers):
            if broker.name in first:
                raise ConfigError(
                    f"brokers[{index}].name",
                    f"{broker.name!r} is already brokers[{first[broker.name]}]'s: each broker needs a name "
                    "of its own (its reports' offsets are checkpointed by name)",
                )
            first.setdefault(broker.name, index)
        for name in ("trigger_interval_s", "tick_interval_s", "compliance_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, "must be positive")
        if isinstance(self.message_expiry_s, bool) or not 1 <= self.message_expiry_s <= MAX_EXPIRY_S:
            raise ConfigError("message_expiry_s", f"must be from 1 to {MAX_EXPIRY_S} seconds (365 days)")
        if not 1 <= self.report_topics_per_task <= 10_000:
            raise ConfigError("report_topics_per_task", "must be from 1 to 10000")
        if self.device_buckets < 0:
            raise ConfigError("device_buckets", "must be 0 (per-device topics) or more")
        if self.report_identity not in REPORT_IDENTITIES:
            raise ConfigError(
                "report_identity", f"expected client_id or payload, got {self.report_identity!r}"
            )
        if self.backend not in ("auto", "delta-rs", "native"):
            raise ConfigError("backend", f"expected auto, delta-rs or native, got {self.backend!r}")
        filters = [f.strip() for f in self.status_topics.split(",")]
        for topic_filter in filters:
            try:
                validate_topic_filter(topic_filter)
            except InvalidTopic as exc:
                raise ConfigError("status_topics", f"{topic_filter!r} is not a topic filter: {exc}") from None
            if topic_filter.startswith("$share/"):
                raise ConfigError("status_topics", f"{topic_filter!r}: a shared subscription reads no log")
