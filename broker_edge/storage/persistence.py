"""Persistence rules: which publishes go to the log, and with which retention (first matching rule wins)."""

from __future__ import annotations

from collections.abc import Sequence

from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.topics import topic_matches, validate_topic_filter

from .config import PersistRule

_NO_RULE = -1
_CACHE_LIMIT = 4096
"""Topics without a log whose rule is remembered (a topic with a log keeps its rule in the topic table)."""
NO_MATCH = 254
"""`rule_number` of a topic no rule matches (fits the topic table's one-byte column)."""
NOT_LOGGED, LOGGED, CREATES_LOG = 0, 1, 2
"""`LogStore.persist_as`: a publish not logged; logged to its topic's log; logged, creating the log."""


def check_filter(topic_filter: str) -> None:
    """Raise `ValueError` unless `topic_filter` is a well-formed MQTT topic filter (MQTT 4.7)."""
    try:
        validate_topic_filter(topic_filter)
    except InvalidTopic as error:
        raise ValueError(str(error)) from error


class RuleError(ValueError):
    """A persistence rule that cannot be used: ``key`` names it in the list and its field (``[0].qos``), or is
    empty for the list as a whole."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"persist{key}: {detail}" if key else detail)
        self.key = key
        self.detail = detail


def check_rules(rules: Sequence[PersistRule]) -> None:
    """Raise `RuleError` unless every rule can be used: a well-formed topic filter, QoS levels within 0, 1,
    2, retention bounds of at least 1 (or none), and fewer rules than `NO_MATCH`."""
    if len(rules) >= NO_MATCH:
        raise RuleError("", f"at most {NO_MATCH - 1} persistence rules, got {len(rules)}")
    for number, rule in enumerate(rules):
        try:
            check_filter(rule.pattern)
        except ValueError as error:
            raise RuleError(f"[{number}].pattern", str(error)) from None
        if not set(rule.qos) <= {0, 1, 2}:
            raise RuleError(f"[{number}].qos", f"must be within 0, 1, 2, got {list(rule.qos)}")
        for name in ("retention_bytes", "retention_ms"):
            value = getattr(rule, name)
            if value is not None and value < 1:
                raise RuleError(
                    f"[{number}].{name}",
                    f"must be >= 1 (or null: storage.{name} applies; to keep these topics' records without "
                    f"limit, make storage.{name} null and give the other rules theirs), got {value}",
                )


class PersistenceRules:
    """Ordered rules with a bounded per-topic cache (every publish asks, most topics repeat)."""

    def __init__(self, rules: list[PersistRule]) -> None:
        check_rules(rules)
        self.rules = list(rules)
        self._qos_sets = [frozenset(rule.qos) for rule in rules]
        self.logged_qos: frozenset[int] = frozenset().union(*self._qos_sets)
        """The QoS levels some rule persists: a publish of another QoS is never logged, whatever its topic."""
        self.qos_of_rule: tuple[frozenset[int], ...] = (*self._qos_sets, *[frozenset()] * (NO_MATCH + 1))
        """The QoS levels each rule persists, by its number (none for `NO_MATCH`): an index, no call (every
        logged publish asks)."""
        self._patterns = [rule.pattern for rule in rules]
        self._cache: dict[str, int] = {}

    def rule_number(self, topic: str) -> int:
        """The number of the first rule matching `topic` (`NO_MATCH` when none does), not cached (a topic with
        a log keeps it in its column); a new topic's first publish asked `should_persist` already, whose
        cached answer is taken rather than matching every rule again."""
        cached = self._cache.get(topic)
        if cached is None:
            cached = self._match(topic)
        return NO_MATCH if cached == _NO_RULE else cached

    def should_persist(self, topic: str, qos: int) -> bool:
        """Whether a publish on `topic` with `qos` is appended to the log."""
        number = self._rule_number(topic)
        return number != _NO_RULE and qos in self._qos_sets[number]

    def _rule_number(self, topic: str) -> int:
        number = self._cache.get(topic)
        if number is None:
            number = self._match(topic)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[topic] = number
        return number

    def _match(self, topic: str) -> int:
        """The number of the first rule matching `topic` (`_NO_RULE` when none does): a new topic per device
        asks this once, and the default rule (`#`, every topic but the broker's `$` ones) answers without
        splitting the topic into levels."""
        for number, pattern in enumerate(self._patterns):
            if pattern == "#":
                if topic[:1] != "$":
                    return number
            elif topic_matches(pattern, topic):
                return number
        return _NO_RULE
