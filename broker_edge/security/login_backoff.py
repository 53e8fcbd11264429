"""Slowing password guessing: backoff per client address and per user name, without locking real users out.

Sans-IO: times come in as numbers (``loop.time()`` in the broker). After ``threshold`` failed logins from
one address, or for one user name, further attempts are refused at once, without a hash, until a backoff
has passed; then one attempt is checked, and if it fails too the backoff doubles, up to ``max_backoff_s``.
Failures are forgotten ``forget_s`` after the last one, and a successful login clears its address.

A backoff on a user name does not lock that user out: an attempt whose password the broker has verified
before goes through at once (``PasswordFile`` remembers successful checks), and so does an attempt from an
address this user has logged in from (its password is hashed as usual). Only new addresses trying that
name wait. A backoff on an address affects only that address. Each table is bounded (the least recently
touched entries are forgotten first), so the tables cannot be used to fill memory.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from broker_edge.config import ConfigError

__all__ = ["LoginBackoff", "LoginBackoffConfig"]


@dataclass
class LoginBackoffConfig:
    """When failed password logins slow further attempts (per client address and per user name)."""

    threshold: int = 5
    """Failed logins from one address, or for one user name, before further attempts wait; 0 = no backoff."""
    backoff_s: float = 1.0
    """First wait after the threshold; each further failure doubles it."""
    max_backoff_s: float = 60.0
    """Longest wait."""
    forget_s: float = 600.0
    """Failures are forgotten this many seconds after the last one."""
    max_tracked: int = 100_000
    """Addresses (and as many user names, and address/user pairs that logged in) remembered at most."""

    def __post_init__(self) -> None:
        for name in ("threshold", "max_tracked"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(name, f"must be an integer >= 0, got {value!r}")
        for name in ("backoff_s", "max_backoff_s", "forget_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(name, f"must be > 0, got {value!r}")
        if self.max_backoff_s < self.backoff_s:
            raise ConfigError(
                "max_backoff_s", f"must be >= backoff_s ({self.backoff_s}), got {self.max_backoff_s}"
            )


class _Failures:
    __slots__ = ("count", "last", "until")

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0
        self.until = 0.0


class _Bounded(OrderedDict):
    """A dict that forgets its least recently touched keys beyond ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def touch(self, key: object, value: object) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


class LoginBackoff:
    """Failed-login bookkeeping of one broker (see the module docstring)."""

    def __init__(self, config: LoginBackoffConfig) -> None:
        self.config = config
        self._addresses = _Bounded(config.max_tracked)
        self._users = _Bounded(config.max_tracked)
        self._known = _Bounded(config.max_tracked)
        """(user name, address) pairs that logged in: a backoff on the user name does not apply to them."""

    def admit(self, address: str, username: str | None, now: float) -> bool:
        """Whether an attempt may have its password hashed; False: refuse it at once, without a hash.

        ``username`` is None when it is not a user of the password file (nothing to protect). An admitted
        attempt counts as a failure until ``succeeded`` says otherwise, so that parallel attempts cannot
        all slip through before the first one fails.
        """
        if self.config.threshold == 0:
            return True
        if self._in_backoff(self._addresses, address, now):
            return False
        user = username if username is not None and (username, address) not in self._known else None
        if user is not None and self._in_backoff(self._users, user, now):
            return False
        self._count(self._addresses, address, now)
        if user is not None:
            self._count(self._users, user, now)
        return True

    def succeeded(self, address: str, username: str) -> None:
        """An admitted attempt logged in: its address starts afresh and passes a backoff on this user name
        from now on; the user name's failures lose the one counted for this attempt."""
        if self.config.threshold == 0:
            return
        self._addresses.pop(address, None)
        entry = self._users.get(username)
        if entry is not None and (username, address) not in self._known:
            entry.count -= 1
        self._known.touch((username, address), True)

    def _in_backoff(self, table: _Bounded, key: str, now: float) -> bool:
        entry = table.get(key)
        if entry is None:
            return False
        if now - entry.last > self.config.forget_s:
            del table[key]
            return False
        return now < entry.until

    def _count(self, table: _Bounded, key: str, now: float) -> None:
        config = self.config
        entry = table.get(key)
        if entry is None or now - entry.last > config.forget_s:
            entry = _Failures()
        entry.count += 1
        entry.last = now
        over = entry.count - config.threshold
        if over >= 0:
            entry.until = now + min(config.max_backoff_s, config.backoff_s * 2 ** min(over, 32))
        table.touch(key, entry)
