"""The data directory: topic logs and the broker's own files in two namespaces no topic name can cross.

::

    <data>/
      topics/<encoded topic>/...   one directory per topic log (names from `topic_names`)
      meta/LAYOUT                  the layout version ("2")
      meta/CLEAN_SHUTDOWN          present only between a clean close and the next open
      meta/sessions.json           persistent sessions (and sessions.json.tmp while it is replaced)

Every topic directory is a child of `topics/`, so a topic called `CLEAN_SHUTDOWN`, `sessions.json` or
`meta` is just another log and never touches a broker file.

Layout 1 (before `meta/LAYOUT` existed) kept both side by side in `<data>`. `open_layout` moves such a
directory into layout 2 at start, losing nothing: every subdirectory is a topic log and goes to `topics/`,
the broker's files (`CLEAN_SHUTDOWN`, `sessions.json*`) go to `meta/`. The move is staged in
`<data>/.layout-2` (a name no topic encoding produces: encoded names never start with a dot) and finished by
two renames and the `LAYOUT` file, last; a start interrupted at any point resumes the move on the next start.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from .segment import fsync_directory

__all__ = ["LAYOUT_VERSION", "DataLayout", "open_layout"]

log = logging.getLogger(__name__)

LAYOUT_VERSION = "2"
TOPICS = "topics"
META = "meta"
LAYOUT_FILE = "LAYOUT"
STAGING = ".layout-2"
_LAYOUT_1_BROKER_FILES = ("CLEAN_SHUTDOWN", "sessions.json")
"""Files of the broker in a layout-1 directory (``sessions.json`` with its ``.tmp`` and set-aside copies)."""


@dataclass(frozen=True, slots=True)
class DataLayout:
    """The paths of one data directory in layout 2."""

    root: str
    topics: str
    meta: str

    def meta_file(self, name: str) -> str:
        """The path of one broker file (``CLEAN_SHUTDOWN``, ``sessions.json``)."""
        return os.path.join(self.meta, name)


def layout_of(root: str | os.PathLike[str]) -> DataLayout:
    """The layout-2 paths under ``root`` (nothing is created)."""
    root = os.fspath(root)
    return DataLayout(root, os.path.join(root, TOPICS), os.path.join(root, META))


def open_layout(root: str | os.PathLike[str]) -> DataLayout:
    """Create or migrate ``root`` into layout 2 and return its paths (raises `OSError` if it cannot)."""
    layout = layout_of(root)
    os.makedirs(layout.root, exist_ok=True)
    marker = layout.meta_file(LAYOUT_FILE)
    if os.path.exists(marker):
        _remove_empty_staging(layout.root)
    else:
        _migrate(layout)
    return layout


def _migrate(layout: DataLayout) -> None:
    """Move a layout-1 directory (empty for a first start, or the rest of an interrupted move) into layout 2.

    A first start takes the same steps with nothing to move, so that it is never left half made either.
    """
    root = layout.root
    staging = os.path.join(root, STAGING)
    staged_topics = os.path.join(staging, TOPICS)
    staged_meta = os.path.join(staging, META)
    if not os.path.exists(os.path.join(staged_meta, LAYOUT_FILE)):
        os.makedirs(staged_topics, exist_ok=True)
        os.makedirs(staged_meta, exist_ok=True)
        moved = 0
        with os.scandir(root) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name == STAGING:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    os.rename(entry.path, os.path.join(staged_topics, entry.name))
                    moved += 1
                elif entry.name.startswith(_LAYOUT_1_BROKER_FILES):
                    os.rename(entry.path, os.path.join(staged_meta, entry.name))
        for directory in (staged_topics, staged_meta, staging, root):
            fsync_directory(directory)
        _write_layout_file(staged_meta)  # the staging is complete: what is left is two renames
        if moved or os.listdir(staged_meta) != [LAYOUT_FILE]:
            log.warning(
                "data directory %s moved to layout %s: %d topic logs into %s/, the broker's files into %s/",
                root,
                LAYOUT_VERSION,
                moved,
                TOPICS,
                META,
            )
    for name in (TOPICS, META):  # meta (with LAYOUT) last: its arrival means the move is done
        staged = os.path.join(staging, name)
        if os.path.isdir(staged):
            os.rename(staged, os.path.join(root, name))
            fsync_directory(root)
    _remove_empty_staging(root)


def _remove_empty_staging(root: str) -> None:
    staging = os.path.join(root, STAGING)
    if os.path.isdir(staging):
        os.rmdir(staging)
        fsync_directory(root)


def _write_layout_file(meta: str) -> None:
    path = os.path.join(meta, LAYOUT_FILE)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="ascii") as file:
        file.write(LAYOUT_VERSION + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(meta)
