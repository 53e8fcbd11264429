"""Readers of the offsets API (the Spark source on executors, peer brokers) never load the storage engine,
and a log's state is one type wherever it is read."""

import subprocess
import sys
from typing import get_type_hints

from broker_edge import log_info
from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.storage import LogInfo


def _modules_after(statement: str) -> set[str]:
    """The ``broker_edge`` modules a fresh interpreter has loaded after running ``statement``."""
    code = f"{statement}\nimport sys\nprint(' '.join(m for m in sys.modules if m.startswith('broker_edge')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def test_the_client_and_the_spark_source_reader_load_nothing_of_storage_nor_the_server():
    loaded = _modules_after("import broker_edge.offsets_api.client, sources.slice_reader")
    assert {"broker_edge.log_info", "broker_edge.offsets_api.results"} <= loaded
    assert not {name for name in loaded if name.startswith("broker_edge.storage")}
    assert "broker_edge.offsets_api.server" not in loaded


def test_the_store_reports_logs_in_the_type_the_client_decodes():
    """One ``LogInfo``: what the store lists is what the client decodes."""
    assert LogInfo is log_info.LogInfo
    assert get_type_hints(OffsetsClient.list_logs)["return"] == list[LogInfo]
    loaded = _modules_after("import broker_edge.storage")
    assert "broker_edge.log_info" in loaded
