"""Broker limits: the configuration of every bound, and the sans-IO rate limiters that enforce some of them.

A broker on the edge faces thousands of devices that reconnect in storms after a power cut or a network
flap; every resource a client can make the broker spend (sockets, memory for queues and buffers, log files,
CPU per message) has a bound here. The limiters take the current time as a number so they are tested without
clocks and the caller decides which clock to use (``loop.time()`` in the broker).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from broker_edge.config import ConfigError

if TYPE_CHECKING:
    from broker_edge.security.http_budget import MemoryBudget

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "ConnectionAdmission",
    "LimitsConfig",
    "TokenBucket",
    "check_http_limits",
    "topic_over_limits",
]

MQTT_MAX_PACKET_SIZE = 268_435_455  # largest Remaining Length plus fixed header the protocol can express
MAX_WRITE_BUFFER_BYTES = 2**31 - 1
"""Largest ``outgoing_buffer_bytes``: uvloop keeps a transport's write-buffer limits in C ints, and a larger
high-water mark raised ``OverflowError`` on every connection."""


def topic_over_limits(topic: str, max_length: int, max_levels: int) -> bool:
    """Whether a topic name or filter is longer (UTF-8 bytes) or deeper (levels) than the broker allows.

    Cheap for the common case: a topic of n characters has between n and 4n UTF-8 bytes, so it is encoded
    only when that range straddles the bound.
    """
    length = len(topic)
    if length > max_length or (length * 4 > max_length and len(topic.encode()) > max_length):
        return True
    return topic.count("/") >= max_levels


class TokenBucket:
    """Allow ``rate_per_s`` events per second on average, and bursts of up to ``burst`` events.

    The bucket starts full: a client that has been quiet may spend its whole burst at once. A clock that
    steps backwards refills nothing (it never drains either), so a wall-clock adjustment cannot grant a
    burst. ``rate_per_s == 0`` means the bucket never refills: ``burst`` events in total.
    """

    __slots__ = ("_last", "_tokens", "burst", "rate_per_s")

    def __init__(self, rate_per_s: float, burst: int) -> None:
        if rate_per_s < 0:
            raise ValueError(f"rate_per_s must be >= 0, got {rate_per_s}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self.rate_per_s = float(rate_per_s)
        self.burst = burst
        self._tokens = float(burst)
        self._last: float | None = None

    def try_acquire(self, now: float, tokens: int = 1) -> bool:
        """Take ``tokens`` if available at time ``now`` (seconds, any monotonic origin); never waits."""
        self._refill(now)
        if self._tokens >= tokens:
            self._tokens -= tokens
            return True
        return False

    def available(self, now: float) -> float:
        """Tokens that could be taken at ``now`` (for tests and for advertising a retry delay)."""
        self._refill(now)
        return self._tokens

    def seconds_until(self, now: float, tokens: int = 1) -> float:
        """How long until ``tokens`` are available (``inf`` if never: more than the burst, or no refill)."""
        self._refill(now)
        missing = tokens - self._tokens
        if missing <= 0:
            return 0.0
        if tokens > self.burst or self.rate_per_s == 0:
            return float("inf")
        return missing / self.rate_per_s

    def _refill(self, now: float) -> None:
        last = self._last
        if last is None or now < last:
            self._last = now
            return
        self._tokens = min(self.burst, self._tokens + (now - last) * self.rate_per_s)
        self._last = now


class ConnectionAdmission:
    """Decides whether a new TCP/TLS connection may proceed, before any byte of it is parsed.

    Three bounds: the number of open connections (memory, file descriptors), the rate of new ones from one
    source address, and the rate of new ones from all addresses together (a reconnect storm costs TLS
    handshakes, password hashing and session lookups). The per-address bucket is checked before the overall
    one, so one address flooding the broker is refused on its own bucket and cannot spend the tokens every
    other device needs. The per-address buckets live in a bounded map: when it is full, the address used
    least recently gives up its bucket (it gets a full one if it comes back). Refusing early is cheaper than
    refusing after CONNECT. Every successful ``admit`` must be paired with one ``release`` when that
    connection closes.
    """

    __slots__ = (
        "_address_burst",
        "_address_rate",
        "_bucket",
        "_buckets",
        "active",
        "max_addresses",
        "max_connections",
    )

    def __init__(
        self,
        max_connections: int,
        new_per_second: float,
        burst: int,
        new_per_second_per_address: float = 0.0,
        burst_per_address: int = 1,
        max_addresses: int = 10_000,
    ) -> None:
        """``new_per_second == 0`` disables the overall rate bound, ``new_per_second_per_address == 0`` the
        per-address one; ``max_connections`` must be >= 1."""
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if max_addresses < 1:
            raise ValueError(f"max_addresses must be >= 1, got {max_addresses}")
        self.max_connections = max_connections
        self.active = 0
        self._bucket = TokenBucket(new_per_second, max(1, burst)) if new_per_second > 0 else None
        self._address_rate = float(new_per_second_per_address)
        self._address_burst = max(1, burst_per_address)
        self.max_addresses = max_addresses
        self._buckets: dict[str, TokenBucket] = {}
        """Source address → its bucket, least recently used first."""

    @property
    def tracked_addresses(self) -> int:
        """Addresses that hold a bucket now (at most ``max_addresses``)."""
        return len(self._buckets)

    def admit(self, now: float, address: str = "", new: bool = True) -> str | None:
        """``None`` if the connection from ``address`` may proceed (and counts as active), else the refusal.

        The reason is ``"max_connections"`` or ``"rate"``; it is the ``reason`` label of
        ``connections_refused_total``. The connection limit is checked first so that a full broker does
        not also spend rate tokens on connections it refuses, then the address's bucket, then the overall one.
        A connection that is not ``new`` (another member on this host handed it over, having admitted it)
        spends no rate tokens.
        """
        if self.active >= self.max_connections:
            return "max_connections"
        if not new:
            self.active += 1
            return None
        if self._address_rate > 0 and not self._address_bucket(address).try_acquire(now):
            return "rate"
        if self._bucket is not None and not self._bucket.try_acquire(now):
            return "rate"
        self.active += 1
        return None

    def _address_bucket(self, address: str) -> TokenBucket:
        buckets = self._buckets
        bucket = buckets.pop(address, None)
        if bucket is None:
            if len(buckets) >= self.max_addresses:
                del buckets[next(iter(buckets))]
            bucket = TokenBucket(self._address_rate, self._address_burst)
        buckets[address] = bucket  # (re)inserted last: the most recently used
        return bucket

    def release(self) -> None:
        """A previously admitted connection closed."""
        if self.active <= 0:
            raise RuntimeError("release() without a matching admit()")
        self.active -= 1


DEFAULT_MAX_CONNECTIONS = 20_000
"""``LimitsConfig.max_connections`` unless set: a cap of it to the descriptor budget is expected (INFO)."""


@dataclass
class LimitsConfig:
    """Every limit the broker enforces; the defaults suit a production edge broker of a few thousand devices.

    A value of 0 means "unlimited" only where the field's description says so.
    """

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Open client connections, all listeners together; further connections are closed at once (room for a
    10,000-device fleet, the pipelines' own clients and a reconnect storm's sockets not yet closed)."""
    new_connections_per_second: float = 1_000.0
    """Sustained rate of accepted new connections, all listeners and addresses together (reconnect storms);
    0 = unlimited (and no per-address bound either)."""
    new_connections_burst: int = 2_000
    """New connections accepted at once above that rate (a whole site reconnecting)."""
    new_connections_per_second_per_address: float = 500.0
    """Sustained rate of accepted new connections from one source IP address, within the overall rate above:
    half the overall default, so one flooding address leaves at least the other half to every other device;
    0 = no per-address bound."""
    new_connections_burst_per_address: int = 1_000
    """New connections accepted at once from one source address above its rate (a site behind one NAT)."""
    new_connections_tracked_addresses: int = 10_000
    """Source addresses whose per-address rate is remembered; beyond it the least recently seen is dropped."""
    connect_timeout_s: float = 10.0
    """Seconds from TCP accept to a complete CONNECT (TLS handshake included) before the socket is closed."""
    max_connect_packet_size: int = 65_536
    """Largest first packet (CONNECT, will included), in bytes: what an unauthenticated client may send."""
    max_partial_packet_bytes: int = 67_108_864
    """Bytes all connections together may hold as packets not fully arrived; when a read passes it, the client
    address holding the most gives way: its connections are closed (v5: DISCONNECT 0x89 Server busy)."""
    partial_packet_timeout_s: float = 30.0
    """Seconds a packet may take to arrive once its first byte came; a connection still sending is closed."""
    max_packet_size: int = 1_048_576
    """Largest packet accepted from a client, in bytes (advertised as Maximum Packet Size in v5 CONNACK)."""
    receive_maximum: int = 64
    """QoS 1/2 PUBLISHes a client may have unacknowledged towards the broker (advertised in v5 CONNACK; an
    MQTT 3.1.1 client is not read while it has that many)."""
    receive_maximum_exceeded: Literal["hold", "disconnect"] = "hold"
    """An MQTT 5 client sending more QoS 1 PUBLISHes than ``receive_maximum`` unanswered (as clients
    resending what they queued while disconnected do): ``hold`` stops reading it until half are answered
    (TCP slows it down; logged), ``disconnect`` closes it (DISCONNECT 0x93), as ``hold`` also does when its
    open QoS 2 flows take half of them."""
    max_inflight_out: int = 64
    """QoS 1/2 messages sent to one subscriber and not yet acknowledged; more wait in the session queue."""
    max_subscriptions_per_client: int = 100
    """Topic filters one session may hold; SUBSCRIBE beyond it is refused for the extra filters."""
    max_subscription_bytes_per_client: int = 16_384
    """Bytes (UTF-8) of all topic filters one session holds; SUBSCRIBE beyond it is refused for the extra
    filters (v5 0x97)."""
    max_match_nodes: int = 4096
    """Subscription-tree nodes one match of a topic may visit, all sessions' filters together: a SUBSCRIBE
    whose filter would let a publish to a new topic cost more is refused for that filter (v5 0x97, logged).
    Fleets' filters stay far below it (``fleet/+/telemetry``, ``devices/<id>/+/cmd`` visit a few nodes);
    filters that branch on ``+`` at every level reach it; 0 = unlimited."""
    max_subscribe_filters: int = 256
    """Topic filters one SUBSCRIBE or UNSUBSCRIBE may hold; a packet with more is refused as it is decoded,
    at the first filter past it, and only that connection is closed (v5: DISCONNECT 0x97)."""
    max_user_properties: int = 128
    """User properties one packet may hold (CONNECT and its will each, PUBLISH, acks, SUBSCRIBE, DISCONNECT,
    AUTH); a packet with more is refused as it is decoded, and only that connection is closed (v5: 0x97)."""
    max_topic_length: int = 1024
    """Bytes (UTF-8) of a topic name or filter."""
    max_topic_levels: int = 16
    """Levels ('/'-separated parts) of a topic name or filter."""
    max_client_id_length: int = 128
    """Bytes (UTF-8) of a client identifier; MQTT requires at least 23 to be accepted."""
    max_offline_messages: int = 1_000
    """QoS 1/2 messages queued for one session (offline, or its in-flight window full); more are dropped."""
    max_offline_bytes: int = 16_777_216
    """Payload bytes queued for one session; a message that would pass it is dropped (queue_full)."""
    read_bytes_per_turn: int = 65_536
    """Bytes read from clients in one turn of the event loop, all connections together, and a packet handled
    for each 64 of them (of the read that crosses either, what fits is handled); the rest waits for the next
    turn, those sockets not read meanwhile, so a flood never holds the loop: writes, timers, PINGREQ and
    ``/metrics`` are served between turns."""
    outgoing_buffer_bytes: int = 1_048_576
    """Write-buffer high-water mark of one connection (at most 2147483647); above it the subscriber is slow
    (see policy)."""
    slow_subscriber_policy: Literal["backpressure", "disconnect", "drop_qos0"] = "backpressure"
    """What to do with a slow subscriber's QoS 0 messages (QoS 1/2 wait in its session): ``backpressure``
    writes them and stops reading their publishers until it drains (TCP slows them down), ``drop_qos0``
    drops them (counted and logged), ``disconnect`` disconnects it."""
    slow_subscriber_hold_s: float = 10.0
    """With ``backpressure``: how long a subscriber that stopped reading may hold its publishers; past it they
    are read again and its QoS 0 messages are dropped (counted and logged) until it reads."""
    max_keepalive_s: int = 300
    """Largest keep alive the broker grants; a client asking more (or 0) gets this as Server Keep Alive."""
    messages_per_second_per_client: float = 100.0
    """Sustained PUBLISH rate of one client; more wait (reading pauses, TCP pushes back), none is dropped;
    0 = unlimited."""
    messages_burst_per_client: int = 200
    """PUBLISHes one client may send at once above that rate."""
    max_topics_per_client: int = 10_000
    """Topic logs one client id may create by publishing (v5: 0x97 beyond it); 0 = unlimited."""
    max_topics_per_identity: int = 10_000
    """Topic logs one user name (or, anonymous, one non-loopback address) may create, all its client ids
    together (v5: 0x97 beyond it); 0 = unlimited."""
    exempt_users: list[str] = field(default_factory=list)
    """User names of trusted backend jobs (the pipelines, the actions job publishing to every device's
    topic): bound by neither topic quota nor the per-client message rate."""
    http_buffer_bytes: int = 268_435_456
    """Bytes the HTTP endpoints (offsets API, a cluster's members' endpoint, admin) may hold for requests
    together: bodies read and answers being built or sent; a request that would pass it is answered 503
    with Retry-After."""
    http_buffer_members_bytes: int = 67_108_864
    """Of ``http_buffer_bytes``, what only members of a cluster may use: readers and the admin endpoint
    never take it, so replication does not wait for them."""

    def __post_init__(self) -> None:
        _at_least(self, "max_connections", 1)
        _at_least(self, "new_connections_per_second", 0)
        _at_least(self, "new_connections_burst", 1)
        _at_least(self, "new_connections_per_second_per_address", 0)
        _at_least(self, "new_connections_burst_per_address", 1)
        _at_least(self, "new_connections_tracked_addresses", 1)
        _positive(self, "connect_timeout_s")
        _between(self, "max_connect_packet_size", 64, MQTT_MAX_PACKET_SIZE)
        _at_least(self, "max_partial_packet_bytes", 1024)
        _positive(self, "partial_packet_timeout_s")
        _between(self, "max_packet_size", 64, MQTT_MAX_PACKET_SIZE)
        _between(self, "receive_maximum", 1, 65_535)
        _between(self, "max_inflight_out", 1, 65_535)
        _at_least(self, "max_subscriptions_per_client", 1)
        _at_least(self, "max_subscription_bytes_per_client", 1)
        _at_least(self, "max_match_nodes", 0)
        _at_least(self, "max_subscribe_filters", 1)
        _at_least(self, "max_user_properties", 0)
        _between(self, "max_topic_length", 1, 65_535)
        _at_least(self, "max_topic_levels", 1)
        _between(self, "max_client_id_length", 23, 65_535)
        _at_least(self, "max_offline_messages", 0)
        _at_least(self, "max_offline_bytes", 0)
        _at_least(self, "read_bytes_per_turn", 1024)
        _between(self, "outgoing_buffer_bytes", 1024, MAX_WRITE_BUFFER_BYTES)
        _one_of(self, "slow_subscriber_policy", ("backpressure", "disconnect", "drop_qos0"))
        _one_of(self, "receive_maximum_exceeded", ("hold", "disconnect"))
        _positive(self, "slow_subscriber_hold_s")
        _between(self, "max_keepalive_s", 1, 65_535)
        _at_least(self, "messages_per_second_per_client", 0)
        _at_least(self, "messages_burst_per_client", 1)
        _at_least(self, "max_topics_per_client", 0)
        _at_least(self, "max_topics_per_identity", 0)
        _at_least(self, "http_buffer_bytes", 1_048_576)
        _at_least(self, "http_buffer_members_bytes", 0)
        if self.http_buffer_members_bytes >= self.http_buffer_bytes:
            raise ConfigError(
                "http_buffer_members_bytes",
                f"must be below http_buffer_bytes ({self.http_buffer_bytes}), "
                f"got {self.http_buffer_members_bytes}",
            )

    def http_budget(self) -> MemoryBudget:
        """The one memory budget of the broker's HTTP endpoints these limits describe."""
        from broker_edge.security.http_budget import MemoryBudget

        return MemoryBudget(self.http_buffer_bytes, self.http_buffer_members_bytes)

    def connection_admission(self) -> ConnectionAdmission:
        """The broker-wide admission control these limits describe."""
        return ConnectionAdmission(
            self.max_connections,
            self.new_connections_per_second,
            self.new_connections_burst,
            self.new_connections_per_second_per_address if self.new_connections_per_second > 0 else 0.0,
            self.new_connections_burst_per_address,
            self.new_connections_tracked_addresses,
        )

    def is_exempt(self, username: str | None) -> bool:
        """Whether ``username`` is one of ``exempt_users`` (never true for an anonymous client)."""
        return username is not None and username in self.exempt_users

    def client_message_bucket(self, username: str | None) -> TokenBucket | None:
        """A fresh PUBLISH rate limiter for a client of ``username``, or ``None`` when the rate is unlimited
        or the user is one of ``exempt_users``."""
        if self.messages_per_second_per_client == 0 or self.is_exempt(username):
            return None
        return TokenBucket(self.messages_per_second_per_client, self.messages_burst_per_client)


def _number(config: object, name: str) -> float:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, f"expected a number, got {type(value).__name__} {value!r}")
    return value


def check_http_limits(
    max_connections: object, request_timeout_s: object, min_read_bytes_per_s: object = 0
) -> None:
    """Raise ``ConfigError`` naming the field unless the bounds of an HTTP endpoint (the offsets API, the
    admin endpoint, a cluster's members' endpoint) are usable."""
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
        raise ConfigError("max_connections", f"must be an integer >= 1, got {max_connections!r}")
    if isinstance(request_timeout_s, bool) or not isinstance(request_timeout_s, (int, float)):
        raise ConfigError("request_timeout_s", f"must be a number, got {request_timeout_s!r}")
    if not request_timeout_s > 0:
        raise ConfigError("request_timeout_s", f"must be > 0, got {request_timeout_s!r}")
    rate = min_read_bytes_per_s
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
        raise ConfigError("min_read_bytes_per_s", f"must be an integer >= 0, got {rate!r}")


def _at_least(config: object, name: str, low: float) -> None:
    if _number(config, name) < low:
        raise ConfigError(name, f"must be >= {low}, got {getattr(config, name)!r}")


def _positive(config: object, name: str) -> None:
    if _number(config, name) <= 0:
        raise ConfigError(name, f"must be > 0, got {getattr(config, name)!r}")


def _one_of(config: object, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ConfigError(name, f"expected one of {', '.join(map(repr, choices))}, got {value!r}")


def _between(config: object, name: str, low: float, high: float) -> None:
    value = _number(config, name)
    if not low <= value <= high:
        raise ConfigError(name, f"must be between {low} and {high}, got {value!r}")
