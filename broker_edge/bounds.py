"""What a broker's logs can hold, as numbers: the one definition that every decoder of another party's numbers
checks against, and that the store enforces on its own appends.

Numbers arrive from parties a broker does not control: a site's or a hub's uplink headers and frames, a
member's calls, a reader's query parameters, values in etcd. Each is checked where it is decoded, with
``offset``, ``count``, ``size`` or ``integer`` below, and refused with ``OutOfBounds`` naming the field: the
caller closes that connection or answers 400, and nothing of the message is applied.

Offsets (and a log's end, the offset after its last record) are at most ``MAX_OFFSET``, 2**53: far below
the signed 64-bit columns the store keeps them in (so ``end + count`` never overflows them), and exact in a
JSON number read by any language (JavaScript's safe integers end there). A topic appending a million
records a second reaches it in 285 years.
"""

from __future__ import annotations

__all__ = [
    "MAX_COUNT",
    "MAX_OFFSET",
    "MAX_SIZE",
    "MAX_TIME_MS",
    "OutOfBounds",
    "count",
    "integer",
    "offset",
    "offset_span",
    "shown",
    "size",
    "time_ms",
]

MAX_OFFSET = 2**53
"""The largest offset a log can end at: a record's offset is below it."""
MAX_COUNT = MAX_OFFSET
"""The most records one message may speak of (its sizes bound it far lower)."""
MAX_SIZE = 2**32 - 1
"""The largest byte size one message may speak of (a u32: every length on a wire of ours)."""
MAX_TIME_MS = 2**53
"""The largest wall time in milliseconds (a few hundred thousand years from the epoch)."""


class OutOfBounds(ValueError):
    """A number another party sent that the logs cannot hold, or that is not an integer at all."""


def shown(value: object) -> str:
    """``value`` as an error message shows it: short, whatever it is (a number of 10,000 digits, a long
    string)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def integer(value: object, name: str, low: int, high: int) -> int:
    """``value`` if it is an integer (not a bool, a float, a string) within ``[low, high]``."""
    if type(value) is not int:
        raise OutOfBounds(f"{name} must be an integer, got {shown(value)}")
    if not low <= value <= high:
        raise OutOfBounds(f"{name} must be within [{low}, {high}], got {shown(value)}")
    return value


def offset(value: object, name: str) -> int:
    """An offset or a log's end: an integer within ``[0, MAX_OFFSET]``."""
    return integer(value, name, 0, MAX_OFFSET)


def count(value: object, name: str, low: int = 0) -> int:
    """A number of records: an integer within ``[low, MAX_COUNT]``."""
    return integer(value, name, low, MAX_COUNT)


def size(value: object, name: str, low: int = 0, high: int = MAX_SIZE) -> int:
    """A number of bytes: an integer within ``[low, high]`` (at most ``MAX_SIZE``)."""
    return integer(value, name, low, min(high, MAX_SIZE))


def time_ms(value: object, name: str) -> int:
    """A wall time in milliseconds since the epoch: an integer within ``[0, MAX_TIME_MS]``."""
    return integer(value, name, 0, MAX_TIME_MS)


def offset_span(first: int, records: int, name: str) -> None:
    """``records`` records from ``first`` end within ``MAX_OFFSET``."""
    if first + records > MAX_OFFSET:
        raise OutOfBounds(f"{name}: {records} records from offset {first} end past {MAX_OFFSET}")
