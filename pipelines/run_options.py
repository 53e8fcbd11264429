"""What the command line decides for any pipeline (``timestone pipeline``), handed to the pipeline's ``run``.

Apart from the runner, which imports every pipeline: a pipeline names this type without importing it back.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.metrics import PipelineMetrics

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """What the command line decides for any pipeline, beyond its configuration."""

    available_now: bool = False
    spark_master: str | None = None
    config_path: str | None = None
    metrics: PipelineMetrics | None = None
    """Where the job counts what it reports as metrics (its query restarts); served with --metrics-port."""
