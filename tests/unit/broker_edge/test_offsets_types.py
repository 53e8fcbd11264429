"""Readers of the offsets API (the Spark source on executors, peer brokers) never load the storage engine."""

import subprocess
import sys

from broker_edge import offsets_types as wire
from broker_edge.storage import LogInfo


def _modules_after(statement: str) -> set[str]:
    """The ``broker_edge`` modules a fresh interpreter has loaded after running ``statement``."""
    code = f"{statement}\nimport sys\nprint(' '.join(m for m in sys.modules if m.startswith('broker_edge')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def test_the_client_and_the_spark_source_reader_load_nothing_of_storage():
    loaded = _modules_after("import broker_edge.offsets_api.client, sources.slice_reader")
    assert "broker_edge.offsets_types" in loaded
    assert not {name for name in loaded if name.startswith("broker_edge.storage")}


def test_the_store_reports_logs_in_the_wire_type():
    """One ``LogInfo``: what the store lists is what the client decodes."""
    assert LogInfo is wire.LogInfo
    loaded = _modules_after("import broker_edge.storage")
    assert "broker_edge.offsets_types" in loaded
