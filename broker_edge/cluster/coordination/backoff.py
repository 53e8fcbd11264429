"""How a node waits between attempts at an etcd that does not answer: exponentially longer, with jitter,
capped; and how it says so: once when etcd stops answering, once when it answers again.

Every broker of a cluster retries the same etcd; without jitter they would all come back at the same
instant, and without a cap a long outage would leave a node minutes behind the etcd that returned. The
waits are "full jitter" (uniform between 0 and the exponential bound), which spreads the retries of many
nodes best. Sans-IO: the caller sleeps for what ``failed`` returns; ``random`` is handed in for tests.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """The waits between attempts at one thing, and the log lines of its state changes."""

    __slots__ = ("cap_s", "failures", "first_s", "log", "random", "what")

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        first_s: float = 0.2,
        cap_s: float = 10.0,
        random_fraction: Callable[[], float] = random.random,
    ) -> None:
        self.what = what
        """What is attempted, for the log lines (``reading the cluster state``)."""
        self.log = log
        self.first_s = first_s
        self.cap_s = cap_s
        self.random = random_fraction
        self.failures = 0
        """Attempts failed in a row."""

    def failed(self, error: BaseException | str) -> float:
        """One more attempt failed: the seconds to wait before the next. The first failure of a run is a
        WARNING, the rest DEBUG."""
        self.failures += 1
        if self.failures == 1:
            self.log.warning(
                "%s failed, retrying with backoff (up to %.0f s apart): %s", self.what, self.cap_s, error
            )
        else:
            self.log.debug("%s failed (%d in a row): %s", self.what, self.failures, error)
        bound = min(self.cap_s, self.first_s * 2 ** min(self.failures - 1, 30))
        return max(self.first_s / 10, bound * self.random())

    def succeeded(self) -> None:
        """The attempt worked: after failures, say so once (INFO), and start again from the first wait."""
        if self.failures:
            self.log.info("%s works again (after %d failed attempts)", self.what, self.failures)
        self.failures = 0
