"""The Python that Spark's local workers run: one that can import this package, or an error at once.

A local Spark session started from Python runs its Python workers with ``PYSPARK_PYTHON``, else the
``python3`` on the PATH; ``spark.pyspark.python`` set on the session's builder is not read there. A PATH
``python3`` outside the virtual environment that holds Timestone fails in the middle of the first batch,
a minute later, with ``ModuleNotFoundError: No module named 'sources'``. ``choose_worker_python`` runs when
the sources are registered:

- unset ``PYSPARK_PYTHON``: the workers run ``spark.pyspark.python`` if the session sets it, else this
  interpreter (``sys.executable``), which imports the package by definition;
- a Python that is set and is not this interpreter is tried once (``import sources``, ``pyarrow``): one that
  cannot import them is a ``WorkerPythonError`` naming it and what to set.

Sessions on a cluster (any master but ``local``) run the cluster's Python on its machines, which the driver
cannot try: there the package is installed on every worker, or ``spark.pyspark.python`` names a Python that
has it (docs/spark-source.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["WorkerPythonError", "choose_worker_python", "missing_modules"]

log = logging.getLogger("sources.worker_python")

WORKER_MODULES = ("sources", "broker_edge", "pyarrow")
"""What a worker imports to read the brokers' logs."""
CHECK_TIMEOUT_S = 60.0


class WorkerPythonError(RuntimeError):
    """Spark's workers would run a Python that cannot read the brokers' logs."""


def missing_modules(python: str) -> list[str] | None:
    """The modules of ``WORKER_MODULES`` that ``python`` cannot import (None: ``python`` does not run).

    Run from the root directory, so that a source checkout in the working directory is not what imports."""
    probe = "import importlib.util as u, sys; print(*(m for m in sys.argv[1:] if u.find_spec(m) is None))"
    try:
        done = subprocess.run(
            [python, "-c", probe, *WORKER_MODULES],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.split()


def _same_interpreter(python: str) -> bool:
    found = shutil.which(python)
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


def choose_worker_python(spark: SparkSession) -> None:
    """Make a local session's workers run a Python that imports this package, or raise
    ``WorkerPythonError`` saying what to set (see the module docstring)."""
    try:
        context = spark.sparkContext
        master = context.master
    except Exception:  # Spark Connect: no context here, the server's workers
        return
    if not (master or "").startswith("local"):
        return
    if "PYSPARK_PYTHON" not in os.environ:
        chosen = context.getConf().get("spark.pyspark.python") or sys.executable
        if context.pythonExec != chosen:
            log.info("Spark's Python workers run %s (PYSPARK_PYTHON is not set)", chosen)
            context.pythonExec = chosen
        setting = "spark.pyspark.python"
    else:
        setting = "PYSPARK_PYTHON"
    python = context.pythonExec
    if _same_interpreter(python):
        return
    missing = missing_modules(python)
    if missing == []:
        return
    why = f"cannot import {', '.join(missing)}" if missing else "does not run"
    raise WorkerPythonError(
        f"Spark's Python workers run {python!r} ({setting}), which {why}: set {setting} to a Python with "
        f"Timestone's pipelines installed (this one is {sys.executable}) before the Spark session starts"
    )
