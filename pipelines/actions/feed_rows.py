"""The rows of the ``actions`` change feed as the fanout takes them: each action's latest, the commits that
hold rows of different content under one id (none of them taken), and the rows appended rather than
updated in place (``engine.py`` decides what each means)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pipelines.actions.operator import action_content, differences

__all__ = ["latest_rows"]

log = logging.getLogger("pipelines.actions.engine")
"""The engine's logger: what it says about rows is the engine's to say."""


def latest_rows(rows: Iterable[dict]) -> tuple[dict[str, dict], dict[str, str], set[str]]:
    """Each action's latest row (rows in commit order); the actions whose latest commit holds rows of
    different content, with why none of them is taken; the actions whose latest row was appended (a change
    feed ``insert``, not an update in place). ``_commit_version`` and ``_change_type`` are taken off."""
    latest: dict[str, dict] = {}
    commits: dict[str, object] = {}
    differing: dict[str, tuple[int, set[str]]] = {}
    inserted: set[str] = set()
    for given in rows:
        row = dict(given)
        commit = row.pop("_commit_version", None)
        key = row["id"]
        if key is None:  # a table made by hand may allow it: no summary can name such an action
            log.warning("an actions row without an id is ignored: nothing can name its action")
            continue
        if row.pop("_change_type", None) == "insert":
            inserted.add(key)
        else:
            inserted.discard(key)
        if key in latest and commit is not None and commits[key] == commit:
            changed = differences(action_content(latest[key]), action_content(row))
            fields = {line.split(":")[0] for line in changed}
            if row.get("cancel") != latest[key].get("cancel"):
                fields.add("cancel")
            if fields or key in differing:
                count, before = differing.get(key, (1, set()))
                differing[key] = (count + 1, before | fields)
        else:
            differing.pop(key, None)  # a later commit says which row is meant
        latest[key], commits[key] = row, commit
    conflicts = {
        key: f"id: {count} rows with different content ({', '.join(sorted(fields))}) in one commit, "
        "none taken: which one is meant is unknown (write one row per action)"
        for key, (count, fields) in differing.items()
        if fields
    }
    return latest, conflicts, inserted
