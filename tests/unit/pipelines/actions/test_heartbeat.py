"""The actions job's heartbeat file (``pipelines/actions/heartbeat.py``), as ``ota status`` reads it."""

from __future__ import annotations

from pathlib import Path

from pipelines.actions.heartbeat import INTERVAL_S, HeartbeatWriter, read_heartbeat


def test_a_beat_after_the_stop_leaves_the_file_saying_the_job_stopped(tmp_path: Path) -> None:
    """A job writes its stop once its ticker has ended, or once its wait for the ticker ran out: a tick that
    outlived that wait (a slow tick on a loaded machine) beat afterwards, and the file said the stopped job
    was running (``ota status``: "running" for 30 s, then "not running (no heartbeat ...)", never
    "stopped")."""
    now = [1_767_225_600_000]
    writer = HeartbeatWriter(str(tmp_path), clock=lambda: now[0])
    writer.beat()
    now[0] += 1000
    writer.stop()

    now[0] += int(INTERVAL_S * 1000) + 1000  # a beat that would be written (its interval passed)
    writer.beat()
    writer.beat(reports_wait_since_ms=now[0])  # and one written at once (the wait changed)

    beat = read_heartbeat(str(tmp_path))
    assert beat is not None and beat.stopped, beat
    assert beat.beat_at_ms == now[0] - int(INTERVAL_S * 1000) - 1000  # the stop's
    assert not beat.running(now[0])
