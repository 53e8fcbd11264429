"""Access control lists: which client may publish to, and subscribe to, which topics.

Rules are checked in order and the first rule that matches decides; when none matches, ``default`` does.
A rule matches a request when its action covers the request (``all`` covers both), its ``users``,
``clients``, ``anonymous`` and ``client_is_user`` conditions hold, and its topic pattern matches:

- publish: the pattern, after substitution, matches the topic name with MQTT wildcard rules;
- subscribe, allow rule: the pattern covers the whole filter, i.e. every topic the filter can match is
  matched by the pattern (``devices/%c/#`` allows ``devices/d1/+`` to client d1, not ``devices/#``);
- subscribe, deny rule: the pattern and the filter can match at least one common topic, so that ``deny
  secret/#`` refuses a subscription to ``#`` instead of letting it through to a later ``allow #``.

``%u`` (the username) and ``%c`` (the client id) stand for one whole topic level. A rule with ``%u`` does
not apply to anonymous clients. A value that contains ``/``, ``+`` or ``#`` (or is empty) would widen the
pattern: such a client never matches an allow rule that uses it, and always matches a deny rule that uses
it (fail closed).

Publish checks run for every PUBLISH, so decisions are cached per (client, username, topic) in a bounded
dictionary; ``reload`` (SIGHUP) re-reads the rules file and replaces the rules in place, emptying the cache,
so every holder of this object sees the new rules; a file that does not load leaves the old rules in force.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from broker_edge.config import ConfigError, load_dataclass, load_yaml_file
from broker_edge.config.loader import NUL_TEXT, decode_text, expand_home, nul_line, undecodable
from broker_edge.protocol.topics import topic_matches

__all__ = ["AccessControl", "AclConfig", "AclRule", "filter_covers", "filters_overlap"]

_SUBSTITUTIONS = ("%u", "%c")


@dataclass
class AclRule:
    """One rule; the first matching rule decides."""

    permission: Literal["allow", "deny"]
    """Whether a matching request is allowed or denied."""
    action: Literal["publish", "subscribe", "all"]
    """Which requests the rule is about; ``all`` means publish and subscribe."""
    topic: str
    """Topic pattern with MQTT wildcards (``+``, ``#``) and ``%u`` / ``%c`` as whole levels."""
    users: list[str] = field(default_factory=list)
    """Usernames the rule applies to; empty = anyone (see ``anonymous``)."""
    clients: list[str] = field(default_factory=list)
    """Client ids the rule applies to; empty = any."""
    anonymous: bool | None = None
    """True = only clients without a username, False = only authenticated clients, unset = both."""
    client_is_user: bool | None = None
    """True = only clients whose client id is their username, False = only others, unset = both."""

    def __post_init__(self) -> None:
        if self.permission not in ("allow", "deny"):
            raise ConfigError("permission", f"expected 'allow' or 'deny', got {self.permission!r}")
        if self.action not in ("publish", "subscribe", "all"):
            raise ConfigError("action", f"expected 'publish', 'subscribe' or 'all', got {self.action!r}")
        problem = _pattern_problem(self.topic)
        if problem:
            raise ConfigError("topic", problem)
        if self.users and self.anonymous:
            raise ConfigError("anonymous", "cannot be true for a rule that names users")
        if self.client_is_user and self.anonymous:
            raise ConfigError("client_is_user", "cannot be true for a rule of anonymous clients")


@dataclass
class _AclFile:
    """The layout of an ACL rules file: a ``rules`` list, the same as in the broker config."""

    rules: list[AclRule] = field(default_factory=list)


@dataclass
class AclConfig:
    """The broker's ACL: rules inline and/or in a separate YAML file, and the default decision."""

    rules: list[AclRule] = field(default_factory=list)
    """Rules checked in order, before those of ``file``."""
    default: Literal["allow", "deny"] | None = None
    """Decision when no rule matches; unset: ``allow`` with no rules and no ``file``, else ``deny``."""
    file: str | None = None
    """YAML file with a ``rules:`` list (same layout), checked after the inline rules; re-read on reload."""
    cache_size: int = 65_536
    """Decisions remembered per action; when full, the oldest are forgotten."""

    def __post_init__(self) -> None:
        expand_home(self, "file")
        if self.cache_size < 0:
            raise ConfigError("cache_size", f"must be >= 0, got {self.cache_size}")


def _configured_rules(config: AclConfig) -> list[AclRule]:
    rules = list(config.rules)
    if config.file:
        rules.extend(_file_rules(Path(config.file)))
    return rules


def _default_of(config: AclConfig) -> Literal["allow", "deny"] | None:
    """``default``, else ``deny`` when a ``file`` is named: one left empty by an edit closes the broker."""
    return config.default or ("deny" if config.file else None)


def _file_rules(path: Path) -> list[AclRule]:
    """The rules of an ACL file; a ``ConfigError`` names the file and the line of what is wrong."""
    import yaml  # here: a broker without an ACL file never needs it

    try:
        text = decode_text(path.read_bytes())
    except OSError as exc:
        raise ConfigError("file", f"cannot read ACL file {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        line, problem = undecodable(exc)
        raise ConfigError(f"{path}, line {line}", problem) from None
    nul = nul_line(text)
    if nul is not None:
        raise ConfigError(f"{path}, line {nul}", NUL_TEXT)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(where, f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    document = load_yaml_file(path)
    rules = document.get("rules")
    if not isinstance(rules, list):
        return load_dataclass(_AclFile, document, str(path)).rules  # the error names the key
    lines = [1] * len(rules)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == "rules" and isinstance(value, yaml.SequenceNode):
                lines = [item.start_mark.line + 1 for item in value.value]
    for index, rule in enumerate(rules):
        try:
            load_dataclass(AclRule, rule, f"rules[{index}]")
        except ConfigError as exc:
            raise ConfigError(f"{path}, line {lines[index]}", str(exc)) from exc
    return load_dataclass(_AclFile, document, str(path)).rules


def _pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a valid ACL topic pattern, or None."""
    if not pattern:
        return "must not be empty"
    if "\0" in pattern:
        return "must not contain NUL"
    levels = pattern.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return f"'#' must be a whole level and the last one: {pattern!r}"
        if "+" in level and level != "+":
            return f"'+' must be a whole level: {pattern!r}"
        if "%" in level and level not in _SUBSTITUTIONS:
            return f"'%u' and '%c' must be whole levels, and no other '%' is allowed: {pattern!r}"
    return None


def filter_covers(pattern: str, topic_filter: str) -> bool:
    """Whether every topic that ``topic_filter`` can match is also matched by ``pattern``."""
    p, f = pattern.split("/"), topic_filter.split("/")
    if topic_filter.startswith("$") and p[0] in ("+", "#"):
        return False
    for i, level in enumerate(p):
        if level == "#":
            return True
        if i >= len(f):
            return False
        if f[i] == "#":
            # The filter reaches deeper than a non-# pattern level. Only "+/#" covers a whole "#": "#"
            # matches topics of one level or more, "+/#" too; below the root "a/#" also matches "a" itself,
            # which "a/+/#" does not.
            return i == 0 and level == "+" and p[1:] == ["#"]
        if level == "+":
            continue
        if f[i] == "+" or f[i] != level:
            return False
    return len(p) == len(f)


def filters_overlap(a: str, b: str) -> bool:
    """Whether some topic name is matched by both filters ``a`` and ``b``."""
    la, lb = a.split("/"), b.split("/")
    first_a, first_b = la[0], lb[0]
    # A first-level wildcard cannot match a $-level; two literal first levels must be equal anyway.
    if first_a in ("+", "#") and first_b.startswith("$"):
        return False
    if first_b in ("+", "#") and first_a.startswith("$"):
        return False
    for i in range(max(len(la), len(lb))):
        x = la[i] if i < len(la) else None
        y = lb[i] if i < len(lb) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != "+" and y != "+" and x != y:
            return False
    return True


def _safe_value(value: str | None) -> bool:
    if not value:
        return False
    return not any(c in value for c in "/+#")


class _CompiledRule:
    """A rule with its pattern split once; substitution happens per request."""

    __slots__ = (
        "allow",
        "anonymous",
        "client_is_user",
        "clients",
        "levels",
        "publish",
        "subscribe",
        "users",
        "uses_c",
        "uses_u",
    )

    def __init__(self, rule: AclRule) -> None:
        self.allow = rule.permission == "allow"
        self.publish = rule.action in ("publish", "all")
        self.subscribe = rule.action in ("subscribe", "all")
        self.levels = rule.topic.split("/")
        self.uses_u = "%u" in self.levels
        self.uses_c = "%c" in self.levels
        self.users = frozenset(rule.users)
        self.clients = frozenset(rule.clients)
        self.anonymous = rule.anonymous
        self.client_is_user = rule.client_is_user

    def applies_to(self, client_id: str, username: str | None) -> bool:
        if self.users and username not in self.users:
            return False
        if self.clients and client_id not in self.clients:
            return False
        if self.anonymous is not None and self.anonymous != (username is None):
            return False
        if self.client_is_user is not None and self.client_is_user != (client_id == username):
            return False
        return not (self.uses_u and username is None)

    def pattern_for(self, client_id: str, username: str | None) -> str | None:
        """The pattern with ``%u`` / ``%c`` filled in, or None when a value would widen it."""
        if self.uses_u and (username is None or not _safe_value(username)):
            return None
        if self.uses_c and not _safe_value(client_id):
            return None
        if not (self.uses_u or self.uses_c):
            return "/".join(self.levels)
        out: list[str] = []
        for level in self.levels:
            if level == "%u" and username is not None:
                out.append(username)
            elif level == "%c":
                out.append(client_id)
            else:
                out.append(level)
        return "/".join(out)


class AccessControl:
    """Decides publish and subscribe requests from ordered rules; the module docstring has the semantics."""

    def __init__(
        self, rules: list[AclRule], default: Literal["allow", "deny"] | None = None, cache_size: int = 65_536
    ):
        """``default`` unset: ``allow`` if there are no rules, else ``deny``."""
        self.rules: list[AclRule] = []
        self.default_allow = True
        self._compiled: list[_CompiledRule] = []
        self._cache_size = cache_size
        self._publish_cache: dict[tuple[str, str | None, str], bool] = {}
        self._subscribe_cache: dict[tuple[str, str | None, str], bool] = {}
        self._install(rules, default)

    def _install(self, rules: list[AclRule], default: Literal["allow", "deny"] | None) -> None:
        compiled = [_CompiledRule(rule) for rule in rules]
        self.rules = list(rules)
        self.default_allow = (default or ("deny" if self.rules else "allow")) == "allow"
        self._compiled = compiled
        self.clear_cache()

    @classmethod
    def from_config(cls, config: AclConfig) -> AccessControl:
        """Inline rules, then those of ``config.file`` (a ``ConfigError`` names the file, line and field)."""
        return cls(_configured_rules(config), _default_of(config), config.cache_size)

    def reload(self, config: AclConfig) -> int:
        """Re-read ``config.file`` and put its rules (after the inline ones) in force; the number of rules.

        On an unreadable or invalid file a ``ConfigError`` naming the file and line is raised and the rules
        in force stay as they were. Decisions cached under the old rules are forgotten.
        """
        rules = _configured_rules(config)
        self._install(rules, _default_of(config))
        return len(rules)

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        """Whether the client may publish to topic name ``topic``."""
        key = (client_id, username, topic)
        decision = self._publish_cache.get(key)
        if decision is None:
            decision = self._decide_publish(client_id, username, topic)
            self._remember(self._publish_cache, key, decision)
        return decision

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """Whether the client may subscribe to ``topic_filter``.

        Pass the plain filter; a ``$share/<group>/`` prefix is removed here, since sharing does not change
        which messages the subscriber may read. Other broker prefixes are the caller's to remove.
        """
        if topic_filter.startswith("$share/"):
            parts = topic_filter.split("/", 2)
            if len(parts) < 3:
                return False
            topic_filter = parts[2]
        key = (client_id, username, topic_filter)
        decision = self._subscribe_cache.get(key)
        if decision is None:
            decision = self._decide_subscribe(client_id, username, topic_filter)
            self._remember(self._subscribe_cache, key, decision)
        return decision

    def clear_cache(self) -> None:
        """Forget cached decisions (they are otherwise valid for the life of this object)."""
        self._publish_cache.clear()
        self._subscribe_cache.clear()

    def _remember(self, cache: dict, key: tuple, decision: bool) -> None:
        if self._cache_size <= 0:
            return
        if len(cache) >= self._cache_size:
            del cache[next(iter(cache))]  # oldest insertion: dicts keep order
        cache[key] = decision

    def _decide_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        for rule in self._compiled:
            if not rule.publish or not rule.applies_to(client_id, username):
                continue
            pattern = rule.pattern_for(client_id, username)
            if pattern is None:
                if rule.allow:
                    continue
                return False
            if topic_matches(pattern, topic):
                return rule.allow
        return self.default_allow

    def _decide_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        for rule in self._compiled:
            if not rule.subscribe or not rule.applies_to(client_id, username):
                continue
            pattern = rule.pattern_for(client_id, username)
            if pattern is None:
                if rule.allow:
                    continue
                return False
            if rule.allow:
                if filter_covers(pattern, topic_filter):
                    return True
            elif filters_overlap(pattern, topic_filter):
                return False
        return self.default_allow
