"""The pipelines' Prometheus metrics, in a registry of their own: query restarts and whether each query
is up, what its micro-batches read and how long they took, when its last one ended (how fresh its tables
are), messages quarantined by reason, Sparkplug B sequence gaps.

``timestone pipeline ... --metrics-port N`` serves them at ``http://127.0.0.1:N/metrics`` (a Databricks job
scrapes or logs them as it likes); tests read the values directly.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PREFIX = "timestone_pipeline"
BATCH_SECONDS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Bucket bounds of a micro-batch's duration: a second-trigger batch to a long catch-up one."""


class PipelineMetrics:
    """The metrics of a pipeline process (one per process: both jobs of the demo may share it)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.query_restarts = Counter(
            f"{PREFIX}_query_restarts",
            "Streaming queries restarted from their checkpoint after a failure, by the error that ended it.",
            ["pipeline", "query", "error"],
            registry=self.registry,
        )
        self.query_up = Gauge(
            f"{PREFIX}_query_up",
            "1 while the streaming query runs, 0 from its failure until its restart.",
            ["pipeline", "query"],
            registry=self.registry,
        )
        self.input_rows = Counter(
            f"{PREFIX}_input_rows",
            "Rows read by the query's completed micro-batches (Spark's numInputRows).",
            ["pipeline", "query"],
            registry=self.registry,
        )
        self.batches = Counter(
            f"{PREFIX}_batches",
            "Micro-batches the query completed.",
            ["pipeline", "query"],
            registry=self.registry,
        )
        self.batch_seconds = Histogram(
            f"{PREFIX}_batch_seconds",
            "Seconds each completed micro-batch took, trigger to commit (Spark's batchDuration).",
            ["pipeline", "query"],
            buckets=BATCH_SECONDS,
            registry=self.registry,
        )
        self.last_batch_end = Gauge(
            f"{PREFIX}_last_batch_end_seconds",
            "When the query's last completed micro-batch ended (Unix time): its tables are that fresh.",
            ["pipeline", "query"],
            registry=self.registry,
        )
        self.quarantined = Counter(
            f"{PREFIX}_quarantined",
            "Messages written to quarantine, by the reason (e.g. sparkplug_unknown_alias).",
            ["pipeline", "reason"],
            registry=self.registry,
        )
        self.skipped_reports = Counter(
            f"{PREFIX}_skipped_reports",
            "Status messages the actions job left out, by the reason (not_a_report, another_device, "
            "not_sent, not_a_target).",
            ["pipeline", "reason"],
            registry=self.registry,
        )
        self.sparkplug_seq_gaps = Counter(
            f"{PREFIX}_sparkplug_seq_gaps",
            "Sparkplug B messages whose sequence number did not follow their edge node's previous one.",
            ["pipeline"],
            registry=self.registry,
        )

    def batch_completed(self, pipeline: str, query: str, progress: Mapping[str, Any]) -> None:
        """Count one completed micro-batch from its progress report (``StreamingQuery.recentProgress``)."""
        seconds = progress["batchDuration"] / 1000
        started = dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
        self.input_rows.labels(pipeline, query).inc(progress["numInputRows"])
        self.batches.labels(pipeline, query).inc()
        self.batch_seconds.labels(pipeline, query).observe(seconds)
        self.last_batch_end.labels(pipeline, query).set(started.timestamp() + seconds)

    def restarts(self, pipeline: str, query: str | None = None) -> float:
        """Restarts counted so far for ``pipeline`` (and ``query``), all errors together."""
        total = 0.0
        for metric in self.query_restarts.collect():
            for sample in metric.samples:
                labels = sample.labels
                if sample.name.endswith("_total") and labels["pipeline"] == pipeline:
                    total += sample.value if query in (None, labels["query"]) else 0.0
        return total

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread."""
        start_http_server(port, host, registry=self.registry)
