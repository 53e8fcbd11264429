"""The in-place move of a layout-2 data directory (a directory per topic) into partition logs (layout 3).

Layout 2 kept every topic in `topics/<encoded topic>/`: segment files of frames back to back, named by
their base offset, an index per segment, and for a cluster's replicas a `leader-epochs` file. The first
open of layout 3 copies them:

1. Each topic's frames are read, segment after segment, each one checked (framing, CRC, offset), and
   appended verbatim to a new store built in `<data>/.layout-3/` (`LogStore.import_frames`): the same
   offsets, times and bytes. A topic whose retention had moved its start begins there; a frame that failed
   its CRC between valid ones is copied as it is (it stays a hole, never served); records a damaged segment
   had lost stay a gap. Its leader epochs go to its partition's epoch journal.
2. The new store is closed cleanly (its segments sealed, its snapshot written), then moved into place:
   `log/` renamed into `<data>`, and `meta/LAYOUT` ("3") written last.
3. `topics/` is deleted (directories whose name is not a topic's are left in it, and said so).

A topic whose log cannot be copied (a segment that cannot be read, offsets past what a log holds) stops
nothing: it is set aside (`quarantine`: listed in `meta/quarantine.json`, neither read nor written), its
directory moved to `<data>/topics.not-copied/` as it was, and every other topic is copied.

A start interrupted anywhere resumes: before `LAYOUT` says 3, the staging store is opened like any store
(its own recovery repairs a torn end) and each topic goes on from where its copy ended; after, only the
deletion of `topics/` (step 3) is left, which every open of layout 3 finishes.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from broker_edge.bounds import MAX_OFFSET

from .config import StorageConfig
from .epoch_journal import EPOCHS_FILE
from .layout import LAYOUT_VERSION, LOG, SEGMENT_FILE, DataLayout, write_layout_file
from .quarantine import QUARANTINE_FILE, QuarantinedLog, read_list, write_list
from .record import PREFIX, PREFIX_SIZE, FrameError, check_frame
from .segment import fsync_directory
from .topic_names import topic_from_directory

__all__ = ["NOT_COPIED", "STAGING", "finish_upgrade", "upgrade_layout_2"]

log = logging.getLogger(__name__)

STAGING = ".layout-3"
NOT_COPIED = "topics.not-copied"
"""Where the directories of layout-2 logs that could not be copied are kept (their logs set aside)."""
_FLUSH_BYTES = 16 * 1024 * 1024
"""The copy is flushed (written and synced) every this many bytes."""


def upgrade_layout_2(layout: DataLayout, config: StorageConfig, store_class: Callable[..., Any]) -> None:
    """Copy every topic of a layout-2 directory into partition logs (a new store of `store_class`, the
    `LogStore`, which opens this), then switch to layout 3."""
    root = layout.root
    staging = os.path.join(root, STAGING)
    staged_log = os.path.join(staging, LOG)
    if not os.path.isdir(layout.log) or os.path.isdir(staged_log):
        store = store_class(staging, replace(config, durability="group"))
        store.open()
        try:
            copied, skipped = _copy_topics(layout, store)
        finally:
            store.close()
        log.warning(
            "data directory %s upgraded to layout %s: %d topic logs copied into partition logs%s",
            root,
            LAYOUT_VERSION,
            copied,
            f"; {len(skipped)} directories that are not topic logs left in {layout.topics}"
            if skipped
            else "",
        )
        if os.path.isdir(layout.log):  # a previous switch got this far: its copy is the one
            shutil.rmtree(layout.log)
        os.rename(staged_log, layout.log)
        fsync_directory(root)
    write_layout_file(layout.meta, LAYOUT_VERSION)
    finish_upgrade(layout)


def finish_upgrade(layout: DataLayout) -> None:
    """Delete what an upgrade left behind once `LAYOUT` says 3: the staging and the topic directories."""
    staging = os.path.join(layout.root, STAGING)
    if os.path.isdir(staging):
        shutil.rmtree(staging)
    if not os.path.isdir(layout.topics):
        return
    with os.scandir(layout.topics) as entries:
        directories = [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
    for path in directories:
        try:
            topic_from_directory(path)
        except ValueError:
            continue  # not a topic's directory: left for whoever put it there
        shutil.rmtree(path)
    if not os.listdir(layout.topics):
        os.rmdir(layout.topics)
    fsync_directory(layout.root)


def _copy_topics(layout: DataLayout, store) -> tuple[int, list[str]]:
    """Copy every topic directory into `store` (going on where an earlier copy stopped); one that cannot
    be copied is set aside (`_set_aside`)."""
    copied = 0
    skipped: list[str] = []
    pending = 0
    try:
        names = sorted(os.listdir(layout.topics))
    except FileNotFoundError:
        return 0, []
    for name in names:
        path = os.path.join(layout.topics, name)
        if not os.path.isdir(path):
            continue
        try:
            topic = topic_from_directory(path)
        except ValueError as error:
            log.error("not a topic log, left where it is: %s (%s)", path, error)
            skipped.append(path)
            continue
        try:
            pending += _copy_topic(path, topic, store)
        except NotCopied as error:
            _set_aside(layout, path, topic, store, error)
            continue
        _copy_epochs(path, topic, store)
        copied += 1
        if pending >= _FLUSH_BYTES:
            store.flush()
            pending = 0
    return copied, skipped


class NotCopied(Exception):
    """A layout-2 log that cannot be copied: a file of it cannot be read, or it holds offsets past what a
    log holds (`bounds.MAX_OFFSET`). Failures writing the new store are not this: they stop the upgrade."""


def _read_source(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise NotCopied(f"cannot read {path}: {error}") from None


def _within_ceiling(offset: int) -> int:
    if not 0 <= offset <= MAX_OFFSET:
        raise NotCopied(f"it holds offset {offset}, past what a log holds ({MAX_OFFSET})")
    return offset


def _set_aside(layout: DataLayout, path: str, topic: str, store, error: Exception) -> None:
    """A topic log that cannot be copied: listed as set aside in `meta/quarantine.json` (its catalog entry
    made, so that the list holds it), and its directory moved to `topics.not-copied/` as it was, where the
    deletion of `topics/` does not reach it."""
    reason = f"its layout-2 log could not be copied ({error})"
    if topic not in store:
        store.import_start(topic, 0)
    listed = os.path.join(layout.meta, QUARANTINE_FILE)
    logs = read_list(listed)
    logs.setdefault(topic, QuarantinedLog(topic, reason, time.time_ns() // 1_000_000))
    write_list(listed, logs)
    kept = os.path.join(layout.root, NOT_COPIED)
    os.makedirs(kept, exist_ok=True)
    try:
        os.rename(path, os.path.join(kept, os.path.basename(path)))
        where = f"its directory moved to {kept}"
    except OSError as move_error:
        where = f"its directory could not be moved ({move_error}) and is deleted with topics/"
    fsync_directory(layout.root)
    log.error("the log of %r is set aside (quarantined): %s; %s", topic, reason, where)


def _copy_topic(directory: str, topic: str, store) -> int:
    """Append the records of one layout-2 log that `store` does not have yet; returns the bytes appended."""
    try:
        names = os.listdir(directory)
    except OSError as error:
        raise NotCopied(f"cannot list {directory}: {error}") from None
    bases = sorted(int(match.group(1)) for name in names if (match := SEGMENT_FILE.match(name)))
    if not bases:
        return 0
    _within_ceiling(bases[-1])
    have = store.durable_end(topic) if topic in store else None
    if have is None and bases[0] > 0:
        store.import_start(topic, bases[0])  # retention had moved the log's start
        have = bases[0]
    appended = 0
    for number, base in enumerate(bases):
        following = bases[number + 1] if number + 1 < len(bases) else None
        if have is not None and following is not None and following <= have:
            continue  # copied by an earlier, interrupted upgrade
        data = _read_source(os.path.join(directory, f"{base:020d}.log"))
        for first, frames, times in _runs(data, base, store.config.max_record_bytes):
            _within_ceiling(first + len(frames))
            if have is not None and first + len(frames) <= have:
                continue
            if have is not None and first < have:
                frames, times, first = frames[have - first :], times[have - first :], have
            store.import_frames(topic, first, frames, times)
            appended += sum(map(len, frames))
            have = first + len(frames)
    if topic not in store:  # a log without a readable record: it goes on where it was
        store.import_start(topic, bases[-1])
    return appended


def _runs(data: bytes, base: int, max_body: int) -> list[tuple[int, list[memoryview], list[int]]]:
    """The readable frames of one layout-2 segment as runs of consecutive offsets: (first offset, frames,
    times). A frame failing its CRC with a valid frame after it is kept (it stays damaged); a frame that
    cannot be stepped over ends the segment (what follows it was lost to the damage)."""
    view = memoryview(data)
    runs: list[tuple[int, list[memoryview], list[int]]] = []
    frames: list[memoryview] = []
    times: list[int] = []
    position, offset = 0, base
    while position < len(data):
        try:
            end, timestamp = check_frame(view, position, offset, max_body)
        except FrameError as error:
            size = (
                PREFIX_SIZE + PREFIX.unpack_from(data, position)[0]
                if position + PREFIX_SIZE <= len(data)
                else 0
            )
            following = position + size
            if error.reason != "checksum" or not _valid_at(view, following, offset + 1, max_body):
                break
            end, timestamp = following, times[-1] if times else 0
        frames.append(view[position:end])
        times.append(timestamp)
        position = end
        offset += 1
    if frames:
        runs.append((base, frames, times))
    return runs


def _valid_at(view: memoryview, position: int, offset: int, max_body: int) -> bool:
    if position >= len(view):
        return False
    try:
        check_frame(view, position, offset, max_body)
    except FrameError:
        return False
    return True


def _copy_epochs(directory: str, topic: str, store) -> None:
    """A replica's leader epochs of the topic, into its partition's journal."""
    try:
        with open(os.path.join(directory, EPOCHS_FILE), encoding="ascii") as file:
            lines = file.read().split("\n")
    except FileNotFoundError:
        return
    except (OSError, ValueError) as error:  # its epochs only: the log itself was copied
        log.error("%s cannot be read (%s): the leader epochs of %r are not copied", directory, error, topic)
        return
    pairs: list[tuple[int, int]] = []
    for line in lines[1:] if lines and lines[0] == "1" else ():
        parts = line.split(" ")
        if len(parts) == 2 and all(part.isdigit() for part in parts):
            pairs.append((int(parts[0]), int(parts[1])))
    if pairs and topic in store:
        journal = store.replicated_log.epoch_journal(store.partition_of(topic))
        if journal.entries(store.topic_id(topic)) != pairs:
            journal.record(store.topic_id(topic), pairs)
            journal.sync()
