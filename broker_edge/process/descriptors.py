"""One budget of file descriptors for the whole process, computed at start from the limit it really has.

Client connections, listeners, the store's file pool, the HTTP endpoints' connections and a cluster's
peers all draw on ``RLIMIT_NOFILE``. Left unchecked, connections reach the limit first and the store,
opening a segment, gets EMFILE. So at start the soft limit is raised to the hard one (where the system
allows), what is open already and everything but client connections is set aside (``needs``, by the
setting that asks for it), and ``limits.max_connections`` is what is left: a larger setting is capped
with a WARNING naming the settings; a configuration whose other needs alone do not fit is refused
(``ConfigError``, exit 2). Connections beyond the cap are closed at accept and counted
(``max_connections``), before the store could starve.
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass

from broker_edge.config.loader import ConfigError

__all__ = [
    "RESERVE",
    "DescriptorBudget",
    "describe_cap",
    "open_descriptors",
    "plan_descriptors",
    "raise_descriptor_limit",
]

log = logging.getLogger("broker_edge.descriptors")

RESERVE = 64
"""Descriptors kept for what no setting counts: log files, the sessions snapshot and its temporary file,
the lock file, etcd's channels, the hasher's and the writer's threads, sockets being accepted and closed."""


@dataclass(frozen=True, slots=True)
class DescriptorBudget:
    """How the process's descriptors are shared: ``connections`` is what client connections may use."""

    limit: int
    """The soft ``RLIMIT_NOFILE`` after raising it (what the kernel enforces)."""
    needs: Mapping[str, int]
    """Descriptors set aside, by the setting (or the part of the process) that needs them."""
    connections: int
    """Client connections that fit: the bound ``limits.max_connections`` is held to."""
    capped_from: int | None
    """``limits.max_connections`` as configured when it did not fit (then capped to ``connections``)."""


def raise_descriptor_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit where allowed; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as error:  # e.g. a hard limit above what the kernel allows
            log.debug("descriptor limit stays at %d (hard %d): %s", soft, hard, error)
        else:
            soft = hard
    return soft


def open_descriptors() -> int:
    """Descriptors the process holds now (0 where the system does not say)."""
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(directory)) - 1)  # minus the one listing it
        except OSError:
            continue
    return 0


def plan_descriptors(limit: int, max_connections: int, needs: Mapping[str, int]) -> DescriptorBudget:
    """Share ``limit`` descriptors: ``needs`` first, then connections (at most ``max_connections``).

    ``ConfigError`` when ``needs`` leave no room for a single connection: its key the setting that needs
    the most (a need named by a dotted key), the others said after it.
    """
    if limit == resource.RLIM_INFINITY or limit < 0:
        return DescriptorBudget(limit, dict(needs), max_connections, None)
    room = limit - sum(needs.values())
    if room < 1:
        settings = [name for name in needs if "." in name]
        raise ConfigError(
            max(settings, key=needs.__getitem__, default="limits.max_connections"),
            f"no file descriptor left for client connections: the process may open {limit} "
            f"(ulimit -n) and {_largest(needs)} need {sum(needs.values())}; lower those settings or "
            "raise the limit",
        )
    if max_connections <= room:
        return DescriptorBudget(limit, dict(needs), max_connections, None)
    return DescriptorBudget(limit, dict(needs), room, max_connections)


def _largest(needs: Mapping[str, int]) -> str:
    ranked = sorted(needs.items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {count}" for name, count in ranked)


def describe_cap(budget: DescriptorBudget) -> str:
    """The WARNING of a capped ``limits.max_connections``: what was asked, what fits and why."""
    return (
        f"limits.max_connections {budget.capped_from} does not fit the process's {budget.limit} file "
        f"descriptors (ulimit -n): capped to {budget.connections}, after {_largest(budget.needs)}; raise "
        "the limit (LimitNOFILE=, ulimit -n) or lower limits.max_connections"
    )
