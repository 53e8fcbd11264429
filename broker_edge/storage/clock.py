"""The store's clocks, and the jumps of its wall clock that retention must not take for time passing.

Records are stamped with the wall clock, and retention ages them by it. Edge boxes set that clock late or
wrong: a box without a real-time clock boots in 1970 until NTP steps it to the real date, and a clock can
be stepped by hours or years either way. Retention then sees records of minutes ago as 56 years old (all
deleted at once, read or not), or records stamped in the future (kept until the clock reaches them).

`ClockJumps` watches the wall clock against one nobody sets (`CLOCK_BOOTTIME`, which counts a suspend) at
every retention pass. When the wall clock moved more than `JUMP_MS` apart from the time that passed, the jump
is said at WARNING and kept (in ``meta/clock-jumps``, so a restart keeps it): records written before it are
aged by the time that passed since, not by the clock's step. Forward, records stamped at or before what the
clock would show without the step are moved by it; back, the segments holding records from before are
closed (rolled) and those of their records stamped after the corrected clock's time (in its future) are.
Nothing of this runs per record: two clock reads per pass, and a few comparisons per group judged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .layout import write_meta_file

__all__ = [
    "CLOCK_JUMPS_FILE",
    "CLOCK_REFERENCE_FILE",
    "JUMP_MS",
    "Clock",
    "ClockJump",
    "ClockJumps",
    "aged_time",
]

log = logging.getLogger(__name__)

CLOCK_JUMPS_FILE = "clock-jumps"
"""The jumps kept, in the store's ``meta/``."""

CLOCK_REFERENCE_FILE = "clock-reference"
"""Both clocks and the boot id at the last clean close, in ``meta/``: a restart in the same boot compares
the clocks with them, so a jump while the broker was stopped is found too."""

JUMP_MS = 60_000
"""How far the wall clock may drift from the time passed between two passes before it counts as a jump."""

MAX_JUMPS = 64
"""Jumps kept at most (the oldest is forgotten past it: a clock flapping between two sources)."""

_NEVER = 2**63 - 1


class Clock:
    """The wall clock (records' times, retention's now) and the time passed since boot, which no one sets.
    The store reads both through this object, which a test replaces by one it moves."""

    __slots__ = ()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def steady_ms(self) -> int:
        return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000

    def boot_id(self) -> str | None:
        """This boot's id (`steady_ms` counts from it; None: not known, not Linux)."""
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
                return file.read().strip() or None
        except OSError:
            return None


@dataclass(frozen=True, slots=True)
class ClockJump:
    """A step of `add_ms` of the wall clock: records of segments numbered below `below[partition]` stamped
    in (`low_ms`, `high_ms`] were stamped by the clock before it, and are aged as if stamped `add_ms`
    later."""

    below: tuple[int, ...]
    low_ms: int
    high_ms: int
    add_ms: int

    def covers(self, partition: int, segment: int) -> bool:
        return partition < len(self.below) and segment < self.below[partition]


class ClockJumps:
    """The wall clock's jumps seen by this store (see the module docstring)."""

    def __init__(self, meta: str, clock: Clock) -> None:
        self.path = os.path.join(meta, CLOCK_JUMPS_FILE)
        self.clock = clock
        self.jumps: list[ClockJump] = _load(self.path)
        self._last: tuple[int, int] | None = None  # (wall, steady) at the last pass
        self._reference = os.path.join(meta, CLOCK_REFERENCE_FILE)

    def start(self, wall_ms: int) -> None:
        """Take the clocks at the last clean close as the first pass's reference if this is the same boot
        (their difference then still means a jump), else `wall_ms` and the time passed now. The file is
        removed: after a crash, a reference older than the jumps found since would find them again."""
        saved = _read_reference(self._reference)
        if saved is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._reference)
        boot = self.clock.boot_id()
        if saved is not None and boot is not None and saved[2] == boot and saved[1] <= self.clock.steady_ms():
            self._last = (saved[0], saved[1])
        else:
            self._last = (wall_ms, self.clock.steady_ms())

    def save_reference(self) -> None:
        """Write both clocks and the boot id for the next start (`start`): at a clean close. A hint only,
        not synced: a file lost or torn only means a jump while stopped is not found."""
        boot = self.clock.boot_id()
        if boot is None:
            return
        temporary = self._reference + ".tmp"
        try:
            with open(temporary, "w", encoding="ascii") as file:
                file.write(f"{self.clock.wall_ms()} {self.clock.steady_ms()} {boot}\n")
            os.replace(temporary, self._reference)
        except OSError as error:
            log.warning("%s cannot be written (%s)", self._reference, error)

    def step(self, wall_ms: int) -> tuple[int, int]:
        """How far the wall clock (now `wall_ms`) stepped apart from the time passed since the last call, and
        that time: (0, passed) within `JUMP_MS`, and at the first call."""
        steady = self.clock.steady_ms()
        last, self._last = self._last, (wall_ms, steady)
        if last is None:
            return 0, 0
        passed = steady - last[1]
        step = wall_ms - last[0] - passed
        return (step if abs(step) > JUMP_MS else 0), passed

    def record(self, wall_ms: int, step: int, passed: int, segment_ends: Sequence[int]) -> ClockJump:
        """Keep and say the jump of `step` found at `wall_ms`. `segment_ends`: per partition, the number below
        which segments hold records from before now (the caller rolls the active segments first when the
        clock went back, so that none holds records from both sides)."""
        unstepped = wall_ms - step  # what the clock would show had it not been stepped
        low = -_NEVER if step > 0 else wall_ms  # back: those stamped after the corrected clock's now
        jump = ClockJump(tuple(segment_ends), low, unstepped, step)
        self.jumps = [*self.jumps, jump][-MAX_JUMPS:]
        _save(self.path, self.jumps)
        log.warning(
            "the wall clock jumped %s by %s (from about %s to %s, %.1f s after the last retention pass): "
            "records written before it are aged by the time that passed, not by the jump",
            "forward" if step > 0 else "back", _span(abs(step)), _iso(unstepped), _iso(wall_ms),
            passed / 1000,
        )  # fmt: skip
        return jump

    def for_segment(self, partition: int, segment: int) -> list[ClockJump]:
        """The jumps that move the times of records in that segment (none, nearly always)."""
        return [jump for jump in self.jumps if jump.covers(partition, segment)] if self.jumps else []

    def forget_before(self, oldest: Sequence[int]) -> None:
        """Drop the jumps no segment left is below (`oldest`: per partition, its oldest segment's number)."""
        kept = [jump for jump in self.jumps if any(jump.covers(p, n) for p, n in enumerate(oldest))]
        if len(kept) != len(self.jumps):
            self.jumps = kept
            _save(self.path, kept)


def aged_time(newest_ms: int, jumps: list[ClockJump]) -> int:
    """The time retention ages a group by: its newest record's, moved by the jumps after it was stamped."""
    for jump in jumps:
        if jump.low_ms < newest_ms <= jump.high_ms:
            newest_ms += jump.add_ms
    return newest_ms


def _read_reference(path: str) -> tuple[int, int, str] | None:
    try:
        with open(path, encoding="ascii") as file:
            wall, steady, boot = file.read(200).strip().split(maxsplit=2)
        return int(wall), int(steady), boot
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # torn or damaged: no reference, as after a reboot
        return None


def _load(path: str) -> list[ClockJump]:
    try:
        with open(path, encoding="utf-8") as file:
            rows = json.load(file)
        return [_jump(row) for row in rows]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as error:
        log.error("%s cannot be read (%s): clock jumps seen before are forgotten", path, error)
        return []


def _jump(row: dict) -> ClockJump:
    """One kept jump; `TypeError` for values of other types (a file written by hand or by another version),
    which retention would otherwise fail on at every pass."""
    below, times = row["below"], (row["low_ms"], row["high_ms"], row["add_ms"])
    if not isinstance(below, list) or not all(_whole(value) for value in (*below, *times)):
        raise TypeError(f"not whole numbers: {row!r}"[:200])
    return ClockJump(tuple(below), *times)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _save(path: str, jumps: list[ClockJump]) -> None:
    try:
        write_meta_file(os.path.dirname(path), os.path.basename(path), json.dumps([asdict(j) for j in jumps]))
    except OSError as error:  # a full disk: kept in memory, said
        log.error("%s cannot be written (%s): a restart forgets the clock's jumps", path, error)


def _span(ms: int) -> str:
    days = ms / 86_400_000
    if days >= 365:
        return f"{days / 365.25:.1f} years"
    return f"{days:.1f} days" if days >= 1 else f"{ms / 1000:.0f} s"


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))
