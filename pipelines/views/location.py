"""Where the notebooks find the Delta tables: one environment variable, one default.

``TIMESTONE_TABLES`` is the tables root (a directory or URI: the ``tables.root`` / ``tables_root`` the
pipelines write under). Unset, it is the demo's tables, ``.timestone/demo/tables``, looked for from the
working directory upwards: a notebook kernel runs in ``notebooks/``, the demo writes at the repository root.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sinks import TableCatalog, TableStore

#: The one setting that points every notebook at a tables root.
TABLES_ENV = "TIMESTONE_TABLES"
#: Where ``timestone demo`` keeps its data by default (broker log, checkpoints, tables).
DEMO_WORKDIR = Path(".timestone/demo")
#: The notebooks' default tables root: the demo's.
DEMO_TABLES = DEMO_WORKDIR / "tables"
#: The telemetry pipeline's config, for its payload columns; ``TIMESTONE_PIPELINE_CONFIG`` names another.
PIPELINE_CONFIG = Path("conf/pipeline.yaml")
NOTEBOOKS = ("notebooks/telemetry.ipynb", "notebooks/ota_rollout.ipynb")


def find_upwards(relative: Path, start: Path | None = None) -> Path | None:
    """``<dir>/<relative>`` for the nearest of ``start`` (default: the working directory) and its parents."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / relative
        if candidate.exists():
            return candidate
    return None


def tables_root(environ: Mapping[str, str] = os.environ, start: Path | None = None) -> str:
    """The tables root the notebooks read: ``TIMESTONE_TABLES``, else the demo's tables (see module doc).

    When neither is there, the default is returned as is, so the error that follows names it.
    """
    configured = environ.get(TABLES_ENV, "").strip()
    if configured:
        return configured
    found = find_upwards(DEMO_TABLES, start)
    return str(found) if found else str(DEMO_TABLES)


def table_catalog(environ: Mapping[str, str] = os.environ, start: Path | None = None) -> TableCatalog:
    """The tables with the telemetry pipeline's payload columns: from its config file when one is found."""
    from pipelines.telemetry.config import load_telemetry_config, load_telemetry_config_file
    from pipelines.telemetry.job import telemetry_catalog

    configured = environ.get("TIMESTONE_PIPELINE_CONFIG", "").strip()
    path = Path(configured) if configured else find_upwards(PIPELINE_CONFIG, start)
    config = load_telemetry_config_file(path) if path else load_telemetry_config(None)
    return telemetry_catalog(config)


def open_tables(spark: SparkSession | None = None, root: str | None = None) -> TableStore:
    """The store the notebooks read through: native Delta when ``spark`` has it (Databricks), else delta-rs.

    Raises ``FileNotFoundError`` naming the root and the setting when a local root holds no tables.
    """
    from sinks import open_table_store

    root = root or tables_root()
    if "://" not in root and not Path(root).is_dir():
        raise FileNotFoundError(
            f"no tables at {root}: run `make demo` in the repository, or set {TABLES_ENV} to a tables root"
        )
    return open_table_store(spark, root, "auto", table_catalog())


def notebooks_hint(root: str) -> str:
    """The line the demo and ``timestone pipeline`` print: the notebooks, and the setting for these tables."""
    shown = root if "://" in root else str(Path(root).resolve())
    return f"Notebooks:     {' and '.join(NOTEBOOKS)} read these tables with {TABLES_ENV}={shown}"
