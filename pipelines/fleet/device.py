"""One simulated device: telemetry, action topics replayed by offset, OTA and commands with status reports.

The device follows docs/device-protocol.md. It holds its own log offsets for the action topics, so it picks
up where it left off after reconnecting to any broker, and replays from ``earliest`` on first boot. A message
on its device bucket's topic lists the devices it is for: the device acts on it only when listed. It sends
its status reports on its bucket's report topic (``actions/reports/<bucket>``), each naming the device and
the attempt it is about. A message for an action it has seen with a higher ``attempt`` is a retry notice: it
starts the action again; one with no higher ``attempt`` is answered with its latest report again. Given
several brokers (members of one cluster), it moves to the next when its broker stops accepting it. A status
report the broker did not acknowledge (refused, or the connection dropped first) is sent again: after a
pause when refused, on reconnecting otherwise.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipelines.actions.buckets import DEFAULT_BUCKETS, bucket_of, bucket_topic, report_topic
from pipelines.actions.checks import http_url, sha256_hex, text
from pipelines.fleet.client import (
    ConnectionRefused,
    Message,
    MqttClient,
    connect_failure,
    past_the_end,
    referral,
)
from pipelines.fleet.readings import reading_encoder

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "REJECTED", "CANCELED"})
REPORT_RETRY_S = 0.5


def malformed(kind: str, action: dict) -> str | None:
    """Why a device refuses an action message outright (docs/device-protocol.md), or None.

    A device checks what it receives, whoever sent it: an OTA needs a version, an http(s) URL and the
    firmware's SHA-256 to check the download against; a command needs its name; other kinds are unknown.
    """
    if kind == "ota":
        for name, check in (("version", text()), ("url", http_url), ("sha256", sha256_hex)):
            if action.get(name) is None:
                return f"ota without {name}"
            problem = check(action[name])
            if problem is not None:
                return f"bad {name}: {problem}"
        return None
    if kind == "command":
        return None if text()(action.get("command")) is None else "command without a name"
    return f"unknown kind {kind!r}"


@dataclass
class DeviceBehaviour:
    """How simulated devices behave; rates are probabilities in [0, 1]."""

    firmware: str = "1.0.0"
    telemetry_interval_s: float = 5.0
    download_delay_s: tuple[float, float] = (0.5, 2.0)
    command_delay_s: tuple[float, float] = (0.1, 0.5)
    failure_rate: float = 0.0
    reject_rate: float = 0.0
    offline_rate_per_min: float = 0.0
    offline_duration_s: tuple[float, float] = (1.0, 5.0)
    keep_alive_s: int = 60
    reconnect_backoff_max_s: float = 30.0
    """The longest pause before another connection attempt: each attempt that fails in a row doubles the
    pause drawn from ``offline_duration_s``, up to this, so a fleet whose brokers are down or overloaded does
    not retry in step (back to the plain draw once a connection is made)."""
    failed_attempts: int = 0
    """Attempts of each action that fail before one may succeed (a download that fails, then works)."""
    silent_attempts: int = 0
    """Attempts of each action that hang after IN_PROGRESS and never report again (a stuck download)."""
    payload_format: str = "json"
    """How readings are written: json, cbor or protobuf (``pipelines/fleet/readings.py``)."""
    telemetry_topic: str = "devices/{device_id}/telemetry"
    """Where readings go, ``{device_id}`` standing for the device's id (a fleet in another format on
    topics of its own: the telemetry job's ``payload.formats``)."""
    version_failure_rates: dict[str, float] = field(default_factory=dict)
    """Share of devices on which a firmware version fails to install, by version (a bad build): the same
    devices every time, chosen by a hash of the device id and the version."""

    def fails_version(self, device_id: str, version: str) -> bool:
        rate = self.version_failure_rates.get(version, 0.0)
        return zlib.crc32(f"{device_id}/{version}".encode()) / 2**32 < rate


@dataclass
class ActionProgress:
    """What a device knows of one action: its latest reported state and report sequence."""

    state: str
    seq: int
    details: str = ""
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    attempt: int = 1


class SimulatedDevice:
    """A device that connects to a broker and lives until :meth:`stop`.

    ``fallbacks`` are other brokers of the same cluster, tried in turn when connecting to the current one
    fails."""

    def __init__(
        self,
        device_id: str,
        group: str,
        broker: tuple[str, int],
        behaviour: DeviceBehaviour,
        rng: random.Random,
        stats: Counter,
        source_address: str | None = None,
        fallbacks: Sequence[tuple[str, int]] = (),
        buckets: int = DEFAULT_BUCKETS,
    ) -> None:
        self.device_id = device_id
        self.group = group
        bucket = bucket_of(device_id, buckets)
        self.bucket_topic = bucket_topic(bucket)
        self.report_topic = report_topic(bucket)
        """Where this device sends its status reports: its bucket's, shared with the other devices of it."""
        self.brokers = [broker, *fallbacks]
        self.broker = broker
        """The broker this device connects to now."""
        self.source_address = source_address
        self.behaviour = behaviour
        self.firmware = behaviour.firmware
        self.rng = rng
        self.stats = stats
        self.offsets: dict[str, int | None] = {topic: None for topic in self.action_topics}
        self.actions: dict[str, ActionProgress] = {}
        self.received_at: dict[str, float] = {}
        """When (epoch seconds) each action message first reached the device: what fanout latency measures."""
        self.finished_at: dict[str, float] = {}
        """When (epoch seconds) the device sent its final report of each action."""
        self.client: MqttClient | None = None
        self._unacknowledged: set[str] = set()
        """Actions whose latest report has not been acknowledged by a broker."""
        self._telemetry_seq = 0
        self._encode_reading = reading_encoder(behaviour.payload_format)
        self._telemetry_timer: asyncio.TimerHandle | None = None
        self._reconnect_timer: asyncio.TimerHandle | None = None
        self._failed_connects = 0
        """Connection attempts that failed since the last one that worked: how long the next pause is."""
        self._connecting = False
        """An attempt to connect is under way (a reconnect due meanwhile is dropped)."""
        self._dropped_while_connecting = False
        """Told to go offline during that attempt: its connection is dropped once made."""
        self._stopped = False

    @property
    def reports_in_flight(self) -> bool:
        """Whether a report of this device's is not yet acknowledged by a broker (its state may be final
        before the report that says so is in a log)."""
        return bool(self._unacknowledged)

    @property
    def action_topics(self) -> tuple[str, str, str, str]:
        return (
            f"actions/devices/{self.device_id}",
            self.bucket_topic,
            f"actions/groups/{self.group}",
            "actions/all",
        )

    # -- connection -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, subscribe to the action topics from the held offsets, resend final reports."""
        host, port = self.broker
        client = await MqttClient.connect(
            host,
            port,
            self.device_id,
            on_message=self._on_message,
            keep_alive=self.behaviour.keep_alive_s,
            log_offsets=True,
            source_address=self.source_address,
        )
        if self._stopped:  # told to stop while connecting: a stopped device holds no connection
            await client.disconnect()
            return
        if self._dropped_while_connecting:  # told to go offline meanwhile: its pause has begun
            self._dropped_while_connecting = False
            self.stats["offline"] += 1
            client.abort()
            if self._reconnect_timer is None:  # the pause ended while the connect was under way
                self._schedule_reconnect(0.0)
            return
        self.client = client
        client.on_disconnect = lambda exc: self._on_disconnect(client)
        for topic in self.action_topics:
            start = self.offsets[topic]
            suback = await client.subscribe_answer(
                topic, 1, [("offset", "earliest" if start is None else str(start))]
            )
            if start is not None and past_the_end(suback):
                self.offsets[topic] = None  # a new store (offsets never go back in one): all of it is new
                await client.subscribe(topic, 1, [("offset", "earliest")])
        self.stats["connects"] += 1
        self._failed_connects = 0
        for action_id, progress in self.actions.items():
            if progress.state in TERMINAL_STATES or action_id in self._unacknowledged:
                self._publish_report(action_id, progress)
        self._schedule_telemetry()

    async def stop(self) -> None:
        """Disconnect cleanly and cancel every timer."""
        self._stopped = True
        for handle in (self._telemetry_timer, self._reconnect_timer):
            if handle:
                handle.cancel()
        for progress in self.actions.values():
            if progress.timer:
                progress.timer.cancel()
        if self.client and self.client.connected:
            await self.client.disconnect()

    def go_offline(self, duration_s: float) -> None:
        """Drop the connection abruptly and come back after ``duration_s`` (a connection under way is
        dropped as soon as it is made)."""
        if self.client and self.client.connected:
            self.stats["offline"] += 1
            self.client.abort()
        elif self._connecting:
            self._dropped_while_connecting = True
        self._schedule_reconnect(duration_s)

    def retry_later(self, error: BaseException, next_broker: bool = False) -> None:
        """Connecting failed with ``error`` (counted by kind: ``connect_failed_timed_out``, ...): try again
        after a pause, as a device in the field would, twice as long as the last one while attempts fail in a
        row (at most ``reconnect_backoff_max_s``), at the broker a refusal named (CONNACK 0x9C), else at the
        next of its list if ``next_broker``."""
        self.stats[f"connect_failed_{connect_failure(error)}"] += 1
        if not self._referred(error) and next_broker:
            self._next_broker()
        pause = self.rng.uniform(*self.behaviour.offline_duration_s) * 2 ** min(self._failed_connects, 30)
        self._failed_connects += 1
        self._schedule_reconnect(min(pause, self.behaviour.reconnect_backoff_max_s))

    def _on_disconnect(self, client: MqttClient) -> None:
        if client is not self.client:
            return  # an earlier connection, taken over by the one the device holds now: nothing to mend
        if self._telemetry_timer:
            self._telemetry_timer.cancel()
        if not self._stopped and self._reconnect_timer is None:  # not a drop of its own (go_offline)
            why = "closed" if client.closed_with is None else f"0x{client.closed_with:02x}"
            self.stats[f"dropped_{why}"] += 1  # by the broker's DISCONNECT reason, or closed without one
            self._follow(referral(client.closed_with, client.server_reference))  # a member (fenced, say)
            self._schedule_reconnect(self.rng.uniform(*self.behaviour.offline_duration_s))

    def _referred(self, error: BaseException) -> bool:
        """Whether a refused CONNECT named the broker to use instead (CONNACK 0x9C), now the next one."""
        return isinstance(error, ConnectionRefused) and self._follow(
            referral(error.reason_code, error.server_reference)
        )

    def _follow(self, elsewhere: tuple[str, int] | None) -> bool:
        """Connect next to the broker a DISCONNECT or CONNACK 0x9C named (``referral``); False (nothing
        changes) when it names none."""
        if elsewhere is None:
            return False
        self.broker = elsewhere
        self.stats["server_references_followed"] += 1
        return True

    def _schedule_reconnect(self, delay_s: float) -> None:
        if self._reconnect_timer:
            self._reconnect_timer.cancel()
        loop = asyncio.get_running_loop()
        self._reconnect_timer = loop.call_later(delay_s, lambda: loop.create_task(self._reconnect()))

    async def _reconnect(self) -> None:
        self._reconnect_timer = None
        if self._stopped or self._connecting:
            return  # one attempt at a time: a second CONNECT would take the first's session over
        self._connecting = True
        try:
            await self.start()
        except (TimeoutError, OSError, ConnectionError) as error:
            self.stats["reconnect_failures"] += 1
            self.retry_later(error, next_broker=True)
        finally:
            self._connecting = False

    def _next_broker(self) -> None:
        if len(self.brokers) > 1:  # after one a Server Reference named, the first of the list
            at = self.brokers.index(self.broker) if self.broker in self.brokers else -1
            self.broker = self.brokers[(at + 1) % len(self.brokers)]
            self.stats["broker_moves"] += 1

    # -- telemetry --------------------------------------------------------------------------------------

    def _schedule_telemetry(self) -> None:
        interval = self.behaviour.telemetry_interval_s
        if interval > 0:
            delay = self.rng.uniform(0.5, 1.5) * interval
            self._telemetry_timer = asyncio.get_running_loop().call_later(delay, self._send_telemetry)

    def _send_telemetry(self) -> None:
        if self.client is None or not self.client.connected:
            return
        offline_chance = self.behaviour.offline_rate_per_min * self.behaviour.telemetry_interval_s / 60
        if offline_chance and self.rng.random() < offline_chance:
            self.go_offline(self.rng.uniform(*self.behaviour.offline_duration_s))
            return
        self._telemetry_seq += 1
        reading = {
            "ts": int(time.time() * 1000),
            "seq": self._telemetry_seq,
            "temperature": round(self.rng.gauss(21.0, 3.0), 2),
            "humidity": round(min(100.0, max(0.0, self.rng.gauss(45.0, 10.0))), 1),
            "battery": round(self.rng.uniform(20.0, 100.0), 1),
            "firmware": self.firmware,
            "group": self.group,
        }
        topic = self.behaviour.telemetry_topic.format(device_id=self.device_id)
        self.client.publish_nowait(topic, self._encode_reading(reading), 1)
        self.stats["telemetry"] += 1
        self._schedule_telemetry()

    # -- actions ----------------------------------------------------------------------------------------

    def _on_message(self, message: Message) -> None:
        if message.offset is not None and message.topic in self.offsets:
            self.offsets[message.topic] = message.offset + 1
        try:
            action = json.loads(message.payload)
            action_id = str(action["action_id"])
            kind = action["kind"]
            listed = action.get("device_ids")
        except (ValueError, KeyError, TypeError, AttributeError):
            self.stats["bad_actions"] += 1
            return
        if listed is not None and (not isinstance(listed, list) or self.device_id not in listed):
            self.stats["actions_not_listed"] += 1  # another device of this bucket's
            return
        self.stats["actions_received"] += 1
        self.received_at.setdefault(action_id, time.time())
        if kind == "cancel":
            self._cancel(action_id)
            return
        attempt = action.get("attempt", 1)
        progress = self.actions.get(action_id)
        if progress is not None and (not isinstance(attempt, int) or attempt <= progress.attempt):
            self._report_again(action_id, progress)  # seen already (a replay, a copy resent after a failover)
            return
        expires_at = action.get("expires_at")
        if expires_at and expires_at < time.time() * 1000:
            self.stats["expired_actions"] += 1
            return
        if progress is None:
            self._begin(action_id, kind, action)
        else:
            self._retry(action_id, kind, action, progress, attempt)

    def _report_again(self, action_id: str, progress: ActionProgress) -> None:
        """A message of an action it has seen: its latest report again, same ``seq`` (the platform may have
        left it out, having no row yet for it), the action not started again."""
        self.stats["repeated_actions"] += 1
        if action_id not in self._unacknowledged:  # else it goes again anyway
            self._publish_report(action_id, progress)

    def _retry(self, action_id: str, kind: str, action: dict, progress: ActionProgress, attempt: int) -> None:
        """A retry notice: start again, or say again that it is done (the platform may not have heard)."""
        self.stats["retries_received"] += 1
        progress.attempt = attempt
        if progress.timer:
            progress.timer.cancel()
            progress.timer = None
        if progress.state in ("SUCCEEDED", "CANCELED", "REJECTED"):
            self._report(action_id, progress.state, progress.details)
            return
        self._begin(action_id, kind, action)

    def _begin(self, action_id: str, kind: str, action: dict) -> None:
        behaviour = self.behaviour
        refused = malformed(kind, action)
        if refused is not None:
            self.stats["malformed_actions"] += 1
            self._report(action_id, "REJECTED", refused)
            return
        if kind == "ota" and action.get("version") == self.firmware:
            self._report(action_id, "SUCCEEDED", "already at version")
            return
        if self.rng.random() < behaviour.reject_rate:
            self._report(action_id, "REJECTED", "rejected by device policy")
            return
        self._report(action_id, "IN_PROGRESS", "downloading" if kind == "ota" else "executing")
        if self.actions[action_id].attempt <= behaviour.silent_attempts:
            return  # stuck: no final report for this attempt
        delay_range = behaviour.download_delay_s if kind == "ota" else behaviour.command_delay_s
        delay = self.rng.uniform(*delay_range)
        loop = asyncio.get_running_loop()
        self.actions[action_id].timer = loop.call_later(delay, self._finish, action_id, kind, action)

    def _finish(self, action_id: str, kind: str, action: dict) -> None:
        progress = self.actions[action_id]
        progress.timer = None
        if progress.state != "IN_PROGRESS":
            return
        bad_build = kind == "ota" and self.behaviour.fails_version(self.device_id, str(action.get("version")))
        failing = progress.attempt <= self.behaviour.failed_attempts or bad_build
        if failing or self.rng.random() < self.behaviour.failure_rate:
            self._report(action_id, "FAILED", "checksum mismatch" if kind == "ota" else "command failed")
            return
        if kind == "ota":
            self.firmware = str(action.get("version", self.firmware))
        self._report(action_id, "SUCCEEDED", "applied")

    def _cancel(self, action_id: str) -> None:
        progress = self.actions.get(action_id)
        if progress is None:
            self.actions[action_id] = ActionProgress("CANCELED", 0, "canceled before start")
            return
        if progress.state in TERMINAL_STATES:
            return
        if progress.timer:
            progress.timer.cancel()
        self._report(action_id, "CANCELED", "canceled by operator")

    def _report(self, action_id: str, state: str, details: str) -> None:
        progress = self.actions.get(action_id)
        if progress is None:
            progress = self.actions[action_id] = ActionProgress(state, 1, details)
        else:
            progress.state, progress.seq, progress.details = state, progress.seq + 1, details
        self.stats[f"reported_{state}"] += 1
        if state in TERMINAL_STATES:
            self.finished_at.setdefault(action_id, time.time())
        self._publish_report(action_id, progress)

    def _publish_report(self, action_id: str, progress: ActionProgress) -> None:
        if progress.seq == 0 or self.client is None:
            return
        self._unacknowledged.add(action_id)
        report = {
            "action_id": action_id,
            "device_id": self.device_id,
            "state": progress.state,
            "seq": progress.seq,
            "ts": int(time.time() * 1000),
            "details": progress.details,
            "firmware": self.firmware,
            "attempt": progress.attempt,
        }
        ack = self.client.publish_tracked(self.report_topic, json.dumps(report).encode())
        if ack is not None:
            ack.add_done_callback(lambda done: self._report_answered(action_id, progress.seq, done))

    def _report_answered(self, action_id: str, seq: int, ack: asyncio.Future) -> None:
        """A report acknowledged is done; one refused is sent again shortly; one whose connection dropped
        is sent again on reconnecting (``start``)."""
        if ack.cancelled() or ack.exception() is not None:
            return
        progress = self.actions.get(action_id)
        if progress is None or progress.seq != seq:
            return  # a later report of this action is on its way
        if ack.result().reason_code < 0x80:
            self._unacknowledged.discard(action_id)
            return
        self.stats["reports_refused"] += 1
        asyncio.get_running_loop().call_later(REPORT_RETRY_S, self._resend_report, action_id, seq)

    def _resend_report(self, action_id: str, seq: int) -> None:
        progress = self.actions.get(action_id)
        if progress is not None and progress.seq == seq and self.client is not None and self.client.connected:
            self._publish_report(action_id, progress)
