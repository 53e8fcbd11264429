"""Giving the free pages of the C heap back to the system: glibc's ``malloc_trim(0)``, now and then.

Python takes every block above 512 bytes from the C heap: frames and the writes joined from them, index
arrays, the tables of lists and dicts, read buffers. A broker under steady load allocates and frees such
blocks all the time, interleaved with blocks that live on (a session, a log's state), so the memory glibc
holds free inside its heap grows while the memory in use stays flat: on its own glibc gives back only the
free space at the top of its heap, which a single live block above it pins. ``malloc_trim(0)`` also
releases the whole free pages inside the heap (``madvise``), so the resident size follows what is in use.

``HeapTrimmer.tick`` is called by the broker's one-second sweep and trims every ``interval_s``. ``ctypes``
is loaded at the first trim, not at start. Where there is no ``malloc_trim`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

TRIM_INTERVAL_S = 30.0
"""Seconds between two trims: a trim of a heap of a few hundred MiB takes milliseconds."""

_NOT_LOADED: Callable[[int], int] = lambda pad: 0  # noqa: E731  (a marker: the function is looked up once)


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` at most every ``interval_s`` seconds of the caller's clock."""

    __slots__ = ("_trim", "interval_s", "next_at", "trims")

    def __init__(self, interval_s: float = TRIM_INTERVAL_S, now: float = 0.0) -> None:
        self.interval_s = interval_s
        self.next_at = now + interval_s
        self.trims = 0
        """Trims done (0 where the C library has no ``malloc_trim``)."""
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
        return True


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
