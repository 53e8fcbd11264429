"""The pipelines' Prometheus metrics, in a registry of their own: query restarts and whether each query
is up, messages quarantined by reason, Sparkplug B sequence gaps.

``timestone pipeline ... --metrics-port N`` serves them at ``http://127.0.0.1:N/metrics`` (a Databricks job
scrapes or logs them as it likes); tests read the values directly.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

PREFIX = "timestone_pipeline"


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
        self.quarantined = Counter(
            f"{PREFIX}_quarantined",
            "Messages written to quarantine, by the reason (e.g. sparkplug_unknown_alias).",
            ["pipeline", "reason"],
            registry=self.registry,
        )
        self.sparkplug_seq_gaps = Counter(
            f"{PREFIX}_sparkplug_seq_gaps",
            "Sparkplug B messages whose sequence number did not follow their edge node's previous one.",
            ["pipeline"],
            registry=self.registry,
        )

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
