"""The committed ends of a replicated store's logs, saved so that a restart shows no uncommitted record.

A cluster's log is readable up to its committed end (the high watermark), which lives in memory and moves
as the in-sync replicas confirm records. Without a saved copy, a restarted replica could only start its
logs committed up to what it holds durably, showing its readers records that were never committed (a tail
the next leader cuts). The store writes every log's committed end to ``meta/replication-offset-checkpoint``
periodically and at close, and a restart starts each log committed up to the saved end (capped at what is
durable): at most what was committed, never more. The replica learns the rest from its leader.

The file is JSON, ``{"version": 1, "committed": {topic: end, ...}}``, replaced atomically (written to a
``.tmp`` file, synced, renamed, the directory synced).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping

from .segment import fsync_directory

__all__ = ["CHECKPOINT_FILE", "read_checkpoint", "write_checkpoint"]

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "replication-offset-checkpoint"
VERSION = 1


def read_checkpoint(path: str) -> dict[str, int] | None:
    """The saved committed ends (None: no checkpoint was ever written here). A damaged file counts as
    every log committed at its start (logged at ERROR): safe, the leader's watermark restores the rest."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    try:
        document = json.loads(data.decode("utf-8"))  # (bytes that are not UTF-8: a ValueError too)
        if not isinstance(document, dict) or document.get("version") != VERSION:
            raise ValueError(f"version must be {VERSION}")
        committed = document["committed"]
        if not isinstance(committed, dict) or not all(
            isinstance(topic, str) and isinstance(end, int) and not isinstance(end, bool) and end >= 0
            for topic, end in committed.items()
        ):
            raise ValueError("committed must map topics to offsets")
    except (ValueError, KeyError) as error:
        log.error("%s is damaged (%s): every log starts committed at its start", path, error)
        return {}
    return dict(committed)


def write_checkpoint(path: str, committed: Mapping[str, int]) -> None:
    """Replace the checkpoint at `path` with `committed`, atomically and durably."""
    temporary = path + ".tmp"
    data = json.dumps({"version": VERSION, "committed": dict(committed)}, separators=(",", ":")).encode()
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
    fsync_directory(os.path.dirname(path))
