"""Data directories as brokers before partition logs left them (layout 2, and layout 1 before it), written
byte for byte the way those brokers wrote them: a directory per topic under `topics/` (percent-encoded, or
hashed with a `TOPIC` file for long names), segment files of frames back to back named by their base
offset, and the broker's files under `meta/`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from broker_edge.storage.record import AppendRecord, encode_record
from broker_edge.storage.topic_names import is_hashed, topic_directory_name

SESSIONS = '{"kept": true}'


def write_layout_2(
    root: Path,
    topics: Mapping[str, Sequence[AppendRecord]],
    segment_records: int = 4,
    starts: Mapping[str, int] | None = None,
    epochs: Mapping[str, Sequence[tuple[int, int]]] | None = None,
) -> dict[str, list[bytes]]:
    """Write a layout-2 directory; returns each topic's frames as stored (what the upgrade must keep).

    `starts` gives topics whose retention moved their start (their records begin at that offset);
    every `segment_records` records a new segment begins."""
    frames_of: dict[str, list[bytes]] = {}
    (root / "meta").mkdir(parents=True, exist_ok=True)
    (root / "meta" / "LAYOUT").write_text("2\n")
    (root / "meta" / "CLEAN_SHUTDOWN").write_bytes(b"")
    (root / "meta" / "sessions.json").write_text(SESSIONS)
    for topic, records in topics.items():
        name = topic_directory_name(topic)
        directory = root / "topics" / name
        directory.mkdir(parents=True)
        if is_hashed(name):
            (directory / "TOPIC").write_text(topic, encoding="utf-8")
        first = (starts or {}).get(topic, 0)
        frames = [
            encode_record(first + n, record.timestamp_ms or 0, record) for n, record in enumerate(records)
        ]
        for start in range(0, len(frames), segment_records):
            base = first + start
            (directory / f"{base:020d}.log").write_bytes(b"".join(frames[start : start + segment_records]))
        if not frames:
            (directory / f"{first:020d}.log").write_bytes(b"")
        pairs = (epochs or {}).get(topic)
        if pairs:
            (directory / "leader-epochs").write_text("1\n" + "".join(f"{e} {s}\n" for e, s in pairs))
        frames_of[topic] = frames
    return frames_of


def as_layout_1(root: Path) -> None:
    """Rearrange a layout-2 directory the way brokers before `meta/` kept it: every topic directory and the
    store's files (`CLEAN_SHUTDOWN`, `sessions.json`) side by side at the top."""
    (root / "topics").rename(root / "new-topics")  # old logs may be called "topics" or "meta" themselves
    (root / "meta").rename(root / "new-meta")
    for log_directory in (root / "new-topics").iterdir():
        log_directory.rename(root / log_directory.name)
    for name in ("CLEAN_SHUTDOWN", "sessions.json"):
        if (root / "new-meta" / name).exists():
            (root / "new-meta" / name).rename(root / name)
    (root / "new-meta" / "LAYOUT").unlink()
    (root / "new-meta").rmdir()
    (root / "new-topics").rmdir()
