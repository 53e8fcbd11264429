"""The probe of a streaming query's own start (bench/stream_start.py), on the suite's Spark session."""

from __future__ import annotations

from bench.stream_start import first_trigger_s, stream_start_s


def test_first_trigger_is_read_from_the_first_progress_report() -> None:
    progress = [{"timestamp": "2026-11-25T21:00:01.250Z"}, {"timestamp": "2026-11-25T21:00:05.000Z"}]
    started_at = 1795640400.0  # 2026-11-25T21:00:00Z
    assert first_trigger_s(progress, started_at) == 1.25


def test_the_probe_runs_its_one_batch_and_times_the_start(spark) -> None:
    start = stream_start_s(spark, runs=1)
    assert 0.0 < start < 60.0
