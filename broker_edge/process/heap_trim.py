"""Keeping the C heap small: glibc's heaps bounded to two at start, their free pages given back now and then.

Python takes every block above 512 bytes from the C heap: frames and the writes joined from them, index
arrays, the tables of lists and dicts, read buffers. A broker under steady load allocates and frees such
blocks all the time, interleaved with blocks that live on (a session, a log's state), so the memory glibc
holds free inside its heap grows while the memory in use stays flat: on its own glibc gives back only the
free space at the top of its heap, which a single live block above it pins. ``malloc_trim(0)`` also
releases the whole free pages inside the heap (``madvise``), so the resident size follows what is in use.

``HeapTrimmer.tick`` is called by the broker's one-second sweep and trims every ``interval_s``. Where there
is no ``malloc_trim`` (musl, macOS) it does nothing.

glibc also gives threads that allocate heaps of their own ("arenas", up to eight per core), each with its
own free space that the others cannot reuse; a broker's threads (the log writer, its sync pool, the
password hasher, executors) would each hold one. ``bound_arenas``, called by ``timestone broker`` before
its first thread starts, sets ``M_ARENA_MAX`` to ``ARENA_MAX``: the main thread's heap and one shared by
the others. It loads ``ctypes`` for that (``malloc_trim`` uses it too). A ``MALLOC_ARENA_MAX`` in the
environment is the operator's choice and is left as it is.

What says whether a broker's memory grows is not its RSS between trims (free pages come and go with the
allocation pattern) but what is in use: the trimmer keeps the VmRSS read right after its last trim
(``rss_after_trim``), and ``heap_in_use`` gives glibc's bytes in use (``mallinfo2``: ``uordblks`` +
``hblkhd``, all arenas); with Python's allocated blocks (``sys.getallocatedblocks``) the broker publishes
them as gauges (``broker_edge.runtime.broker``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARENA_MAX = 2
"""Heaps glibc may create: the main thread's and one for every other thread."""
_M_ARENA_MAX = -8
"""``mallopt``'s parameter number for ``M_ARENA_MAX`` (glibc's malloc.h)."""

TRIM_INTERVAL_S = 30.0
"""Seconds between two trims: a trim of a heap of a few hundred MiB takes milliseconds."""

_NOT_LOADED: Callable[[int], int] = lambda pad: 0  # noqa: E731  (a marker: the function is looked up once)


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` at most every ``interval_s`` seconds of the caller's clock."""

    __slots__ = ("_trim", "interval_s", "next_at", "rss_after_trim", "trims")

    def __init__(self, interval_s: float = TRIM_INTERVAL_S, now: float = 0.0) -> None:
        self.interval_s = interval_s
        self.next_at = now + interval_s
        self.trims = 0
        """Trims done (0 where the C library has no ``malloc_trim``)."""
        self.rss_after_trim = 0
        """This process's VmRSS in bytes read right after the last trim (0: no trim yet, or no /proc)."""
        self._trim: Callable[[int], int] | None = _NOT_LOADED

    def tick(self, now: float) -> None:
        """Trim when the interval has passed since the last trim (or since ``now`` at construction)."""
        if now < self.next_at:
            return
        self.next_at = now + self.interval_s
        self.trim()

    def trim(self) -> bool:
        """Release the free pages of the heap now; False where ``malloc_trim`` does not exist."""
        trim = self._trim
        if trim is _NOT_LOADED:
            trim = self._trim = malloc_trim_function()
        if trim is None:
            return False
        trim(0)
        self.trims += 1
        self.rss_after_trim = resident_bytes()
        return True


def resident_bytes() -> int:
    """This process's VmRSS in bytes, from /proc/self/statm; 0 where there is none."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


_heap_in_use: list[Callable[[], int] | None] = []
"""``heap_in_use_function()``, once looked up."""


def heap_in_use() -> int:
    """Bytes the C heap has handed out and not got back (``heap_in_use_function``); -1 where that is not
    known. ``ctypes`` is loaded by the first call."""
    if not _heap_in_use:
        _heap_in_use.append(heap_in_use_function())
    function = _heap_in_use[0]
    return -1 if function is None else function()


MALLINFO2_FIELDS = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)
"""The members of glibc's ``struct mallinfo2``, in order (each a ``size_t``)."""


def mallinfo2_function() -> Callable[[], Any] | None:
    """glibc's ``mallinfo2`` through ctypes, returning the struct (its fields: ``MALLINFO2_FIELDS``); None
    without it (glibc before 2.33, musl, not Linux). ctypes is loaded here, not at import: a broker that
    never asks never loads it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (ImportError, OSError, AttributeError):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]

    mallinfo2.argtypes = []
    mallinfo2.restype = MallInfo2
    return mallinfo2


def heap_in_use_function() -> Callable[[], int] | None:
    """A function giving the bytes the C heap has handed out and not got back (glibc's ``mallinfo2``:
    ``uordblks`` + ``hblkhd``, over all arenas); None without ``mallinfo2`` (glibc before 2.33, musl)."""
    mallinfo2 = mallinfo2_function()
    if mallinfo2 is None:
        return None

    def heap_in_use() -> int:
        info = mallinfo2()
        return int(info.uordblks) + int(info.hblkhd)

    return heap_in_use


def malloc_trim_function() -> Callable[[int], int] | None:
    """The C library's ``malloc_trim``, or None when it has none (or is not reachable through ctypes)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        function = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


def bound_arenas(arenas: int = ARENA_MAX) -> bool:
    """Let glibc create at most ``arenas`` heaps (``mallopt(M_ARENA_MAX)``); call it before any thread
    allocates (glibc fixes the bound when the first thread needs a heap). False where it is not set: not
    glibc, or ``MALLOC_ARENA_MAX`` already in the environment."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl has a mallopt that does nothing
            return False
        mallopt = libc.mallopt
    except (ImportError, OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(_M_ARENA_MAX, arenas) == 1


def heap_count() -> int:
    """glibc's heaps (the main one and the arenas of threads), as ``malloc_info`` lists them; -1 where there
    is no ``malloc_info``. For tests and diagnostics: it writes and reads a temporary file."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        malloc_info, fopen, fclose = libc.malloc_info, libc.fopen, libc.fclose
    except (ImportError, OSError, AttributeError):
        return -1
    import tempfile
    from pathlib import Path

    fopen.restype = ctypes.c_void_p
    fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    fclose.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "malloc.xml"
        stream = fopen(str(path).encode(), b"w")
        if not stream:
            return -1
        malloc_info(0, stream)
        fclose(stream)
        return path.read_text().count("<heap nr=")
