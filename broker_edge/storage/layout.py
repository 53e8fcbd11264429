"""The data directory: the partition logs and the broker's own files, apart.

::

    <data>/
      log/                         the partition logs: catalog, topic table snapshot, partitions (layout 3)
      meta/LAYOUT                  the layout version ("3")
      meta/CLEAN_SHUTDOWN          present only between a clean close and the next open
      meta/sessions.json           persistent sessions (and sessions.json.tmp while it is replaced)

Topic names never become paths in layout 3 (they are in the catalog), so no topic name can reach a file.

Older layouts are moved forward at open, losing nothing. Layout 1 (before `meta/LAYOUT` existed) kept
topic directories and the broker's files side by side in `<data>`: they are first moved into layout 2
(`topics/<encoded topic>/` per topic, the broker's files in `meta/`), staged in `<data>/.layout-2` (a name no
topic encoding produces) and finished by two renames and the `LAYOUT` file, last. Layout 2 is then copied
into partition logs by `upgrade` (staged in `<data>/.layout-3`). A start interrupted at any point resumes.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from .segment import fsync_directory
from .topic_names import topic_from_directory

__all__ = [
    "LAYOUT_VERSION",
    "LOCK_FILE",
    "LOG",
    "SEGMENT_FILE",
    "STORE_ID_FILE",
    "DataLayout",
    "layout_version",
    "open_layout",
]

log = logging.getLogger(__name__)

LAYOUT_VERSION = "3"
LOG = "log"
TOPICS = "topics"
META = "meta"
LAYOUT_FILE = "LAYOUT"
STAGING = ".layout-2"
STORE_ID_FILE = "STORE_ID"
"""The store's identity in ``meta/`` (``store_identity``): a ``meta/`` holding it is the broker's."""
LOCK_FILE = ".lock"
"""The broker's lock on the directory (``broker_edge.runtime.data_lock``), taken before the store opens: no
part of any layout (a dot name, as no topic's)."""
_LAYOUT_1_BROKER_FILES = ("CLEAN_SHUTDOWN", "sessions.json")
"""Files of the broker in a layout-1 directory (``sessions.json`` with its ``.tmp`` and set-aside copies)."""
_LAYOUT_3_LOG_FILES = ("catalog", "topics.state")
"""Files of layout 3's ``log/`` (`catalog`, `topic_table`) that no layout-1 topic directory holds."""
_PARTITION_NAME = re.compile(r"\d{2,}")
"""A partition's directory in ``log/`` (``00``, ``01``, ...)."""
SEGMENT_FILE = re.compile(r"^(\d{20})\.log$")
"""A segment of a layout-1 or layout-2 topic log, named by its base offset."""


@dataclass(frozen=True, slots=True)
class DataLayout:
    """The paths of one data directory."""

    root: str
    topics: str
    """Layout 2's topic directories (read by the upgrade only)."""
    meta: str
    log: str

    def meta_file(self, name: str) -> str:
        """The path of one broker file (``CLEAN_SHUTDOWN``, ``sessions.json``)."""
        return os.path.join(self.meta, name)

    def log_is_empty(self) -> bool:
        """Whether ``log/`` holds nothing (missing, or emptied): its partition logs are made anew."""
        try:
            return not os.listdir(self.log)
        except (FileNotFoundError, NotADirectoryError):
            return True


def layout_of(root: str | os.PathLike[str]) -> DataLayout:
    """The paths under ``root`` (nothing is created)."""
    root = os.fspath(root)
    return DataLayout(root, os.path.join(root, TOPICS), os.path.join(root, META), os.path.join(root, LOG))


def layout_version(root: str | os.PathLike[str]) -> str | None:
    """The version ``meta/LAYOUT`` names (None: no such file); a damaged file's text, bytes that are not
    ASCII escaped, names none (not decimal)."""
    try:
        with open(os.path.join(os.fspath(root), META, LAYOUT_FILE), "rb") as file:
            return file.read().decode("ascii", errors="backslashreplace").strip()
    except FileNotFoundError:
        return None


def open_layout(root: str | os.PathLike[str]) -> DataLayout:
    """Create ``root`` in layout 3, or move a layout-1 one into layout 2 (see the module docstring); returns
    its paths (raises `OSError` if it cannot). A layout-2 directory is then upgraded by the store."""
    layout = layout_of(root)
    os.makedirs(layout.root, exist_ok=True)
    version = layout_version(layout.root)
    if version is None:
        if _holds_partition_logs(layout.log):
            _restore_layout_file(layout)
            return layout
        if _is_fresh(layout.root):
            _create(layout)
            return layout
        _migrate(layout)
        version = layout_version(layout.root)
    elif not version.isdecimal() and _holds_partition_logs(layout.log) and not os.path.isdir(layout.topics):
        _restore_layout_file(layout, damaged=version)  # emptied or overwritten: as if it were gone
        return layout
    else:
        _remove_empty_staging(layout.root)
    if version not in ("2", LAYOUT_VERSION):
        raise OSError(
            f"{os.path.join(layout.meta, LAYOUT_FILE)}: unknown data directory layout {version!r} "
            "(this version reads 1 to 3)"
        )
    return layout


def _is_fresh(root: str) -> bool:
    """Nothing of any layout: no layout-1 topic log or broker file (an interrupted move's staging is not
    nothing). What else the directory holds (the broker's lock file, others' files and directories) is not
    the broker's and stays where it is."""
    with os.scandir(root) as entries:
        return not any(entry.name == STAGING or _is_layout_1_entry(entry) for entry in entries)


def _is_layout_1_entry(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` of a directory without ``meta/LAYOUT`` is layout 1's: a broker file, or a topic
    log (a directory named as a topic's, holding a segment file). Any other directory is someone else's: a
    mount point's ``lost+found``, certificates, backups kept beside the data."""
    if not entry.is_dir(follow_symlinks=False):
        return entry.name.startswith(_LAYOUT_1_BROKER_FILES)
    try:
        topic_from_directory(entry.path)
        with os.scandir(entry.path) as files:
            return any(SEGMENT_FILE.match(file.name) for file in files)
    except (ValueError, OSError):
        return False


def _holds_partition_logs(log_directory: str) -> bool:
    """Whether ``log/`` is layout 3's (its catalog, topic table snapshot or a partition's directory), not a
    layout-1 topic directory called ``log`` (segment files side by side, never these names)."""
    try:
        with os.scandir(log_directory) as entries:
            return any(
                entry.name in _LAYOUT_3_LOG_FILES
                or (_PARTITION_NAME.fullmatch(entry.name) is not None and entry.is_dir(follow_symlinks=False))
                for entry in entries
            )
    except (FileNotFoundError, NotADirectoryError):
        return False


def _restore_layout_file(layout: DataLayout, damaged: str | None = None) -> None:
    """A layout-3 directory whose ``meta/LAYOUT`` is gone (deleted, or ``meta/`` with it) or `damaged` (what
    it holds names no version): the file is written again. Taking it for layout 1 would move ``log/`` and
    ``meta/`` as if they were topics' logs and delete them after the upgrade, every record of the store with
    them."""
    os.makedirs(layout.meta, exist_ok=True)
    fsync_directory(layout.root)
    write_layout_file(layout.meta, LAYOUT_VERSION)
    if damaged is not None:
        log.warning(
            "%s is damaged (%r names no layout version) and the data directory %s holds partition logs (%s): "
            "written again (layout %s)",
            os.path.join(layout.meta, LAYOUT_FILE), damaged, layout.root, layout.log, LAYOUT_VERSION,
        )  # fmt: skip
        return
    log.warning(
        "data directory %s holds partition logs (%s) but no %s: written again (layout %s)",
        layout.root,
        layout.log,
        os.path.join(META, LAYOUT_FILE),
        LAYOUT_VERSION,
    )


def _create(layout: DataLayout) -> None:
    """A new data directory in layout 3: `meta/` with `LAYOUT`, written last, and `log/`. A `log/` or
    `meta/` of someone else's (not empty) is not taken over: `OSError` naming it. A `meta/` holding the
    broker's `STORE_ID` is the broker's own (its `log/` and `LAYOUT` deleted): kept, the store then gets a
    new id (``store_identity``)."""
    checked: list[tuple[str, tuple[str, ...]]] = [(layout.log, ())]
    if not os.path.isfile(os.path.join(layout.meta, STORE_ID_FILE)):
        checked.append((layout.meta, (LAYOUT_FILE + ".tmp",)))
    for path, ours in checked:
        try:
            others = [name for name in os.listdir(path) if name not in ours]
        except (FileNotFoundError, NotADirectoryError):
            others = [] if not os.path.lexists(path) else [os.path.basename(path)]
        if others:
            raise OSError(
                f"{path} is not the broker's (it holds {', '.join(sorted(others)[:3])}) and the data "
                f"directory {layout.root} has no {os.path.join(META, LAYOUT_FILE)}: move it, or give "
                "storage.directory a directory of its own"
            )
    os.makedirs(layout.log, exist_ok=True)
    os.makedirs(layout.meta, exist_ok=True)
    fsync_directory(layout.root)
    write_layout_file(layout.meta, LAYOUT_VERSION)
    _remove_empty_staging(layout.root)


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
                if entry.name == STAGING or not _is_layout_1_entry(entry):
                    continue  # not the broker's: left where it is
                if entry.is_dir(follow_symlinks=False):
                    os.rename(entry.path, os.path.join(staged_topics, entry.name))
                    moved += 1
                else:
                    os.rename(entry.path, os.path.join(staged_meta, entry.name))
        for directory in (staged_topics, staged_meta, staging, root):
            fsync_directory(directory)
        write_layout_file(staged_meta, "2")  # the staging is complete: what is left is two renames
        if moved or os.listdir(staged_meta) != [LAYOUT_FILE]:
            log.warning(
                "data directory %s moved to layout %s: %d topic logs into %s/, the broker's files into %s/",
                root,
                "2",
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


def write_layout_file(meta: str, version: str) -> None:
    """Write `meta/LAYOUT` naming `version`, atomically and durably."""
    write_meta_file(meta, LAYOUT_FILE, version)


def write_meta_file(meta: str, name: str, line: str) -> None:
    """Write `meta/<name>` holding `line`, atomically and durably (a temporary synced, renamed over it, the
    directory synced): a crash leaves the old file or the new, whole."""
    path = os.path.join(meta, name)
    temporary = path + ".tmp"
    try:
        with open(temporary, "w", encoding="ascii") as file:
            file.write(line + "\n")
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, temporary) from error  # a write's error names no file
    os.replace(temporary, path)
    fsync_directory(meta)
