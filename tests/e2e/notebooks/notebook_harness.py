"""Run a notebook as a user would (nbclient, a python3 kernel on this interpreter, a chosen working directory)
and hand back what it drew: every matplotlib figure the notebook left in a variable, described in the
kernel by :func:`describe` (titles and the data points of each kind of artist)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import numpy as np
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from pipelines.views.render import displayed_pngs, execute

REPO = Path(__file__).resolve().parents[3]
NOTEBOOKS = REPO / "notebooks"

_DESCRIBE_FIGURES = """
import dataclasses as _dataclasses, json as _json, sys as _sys
from matplotlib.figure import Figure as _Figure
_sys.path.insert(0, {repo!r})
from tests.e2e.notebooks.notebook_harness import describe as _describe
with open({path!r}, "w") as _out:
    _json.dump({{_k: _dataclasses.asdict(_describe(_v)) for _k, _v in dict(globals()).items()
                if isinstance(_v, _Figure)}}, _out)
"""


@dataclass
class Chart:
    """What one figure shows: its titles and how many data points each kind of artist draws."""

    title: str
    axes_titles: list[str]
    points: int
    """Finite (x, y) points of plotted lines (markers and line vertices)."""
    bars: int
    """Bars of non-zero size."""
    segments: int
    """Line segments of line collections (``hlines``)."""
    areas: int
    """Filled polygons of non-zero area (``fill_between``, ``stackplot``)."""

    @property
    def drawn(self) -> int:
        return self.points + self.bars + self.segments + self.areas


def describe(figure: Figure) -> Chart:
    axes = figure.get_axes()
    suptitle = figure.get_suptitle() if hasattr(figure, "get_suptitle") else ""
    points = bars = segments = areas = 0
    for ax in axes:
        for line in ax.get_lines():
            xy = np.asarray(line.get_xydata(), dtype=float)
            points += int(np.isfinite(xy).all(axis=1).sum())
        for patch in ax.patches:
            if isinstance(patch, Rectangle) and patch.get_width() != 0 and patch.get_height() != 0:
                bars += 1
        for collection in ax.collections:
            if isinstance(collection, LineCollection):
                segments += len(collection.get_segments())
            elif isinstance(collection, PolyCollection):
                areas += sum(1 for path in collection.get_paths() if _area(np.asarray(path.vertices)) > 0)
    titles = [ax.get_title() for ax in axes]
    return Chart(suptitle or titles[0], titles, points, bars, segments, areas)


def _area(vertices: np.ndarray) -> float:
    x, y = vertices[:, 0], vertices[:, 1]
    return abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))) / 2


@dataclass
class NotebookRun:
    notebook: nbformat.NotebookNode
    charts: dict[str, Chart]

    @property
    def printed(self) -> str:
        return "".join(
            output.get("text", "")
            for cell in self.notebook.cells
            if cell.cell_type == "code"
            for output in cell.outputs
            if output.output_type == "stream"
        )

    def images(self) -> list[bytes]:
        """The PNGs the notebook displayed, in order."""
        return displayed_pngs(self.notebook)


def run_notebook(name: str, cwd: Path, scratch: Path, timeout_s: int = 180) -> NotebookRun:
    """Execute ``notebooks/<name>`` top to bottom with its kernel in ``cwd``; errors raise.

    The caller sets the ``TIMESTONE_*`` environment the kernel sees.
    """
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    figures = scratch / f"{Path(name).stem}-figures.json"
    notebook.cells.append(
        nbformat.v4.new_code_cell(_DESCRIBE_FIGURES.format(repo=str(REPO), path=str(figures)))
    )
    execute(notebook, cwd, timeout_s)
    notebook.cells.pop()
    charts = {name: Chart(**fields) for name, fields in json.loads(figures.read_text()).items()}
    return NotebookRun(notebook, charts)


@dataclass
class DemoRun:
    """``timestone demo`` run with its defaults from a directory laid out like the repository."""

    repository: Path
    stdout: str
    stderr: str = ""

    @property
    def action_id(self) -> str:
        """The demo's first action: the canary group's rollout."""
        return re.search(r"Outcome of (\S+):", self.stdout).group(1)

    @property
    def phased_action_id(self) -> str:
        """The demo's phased rollout of a bad build, stopped by its abort rule."""
        return re.search(r"Outcome of (\S+): ABORTED in phase", self.stdout).group(1)

    @property
    def printed_tables(self) -> str:
        """The value of ``TIMESTONE_TABLES=`` in the demo's last lines."""
        return re.search(r"TIMESTONE_TABLES=(\S+)", self.stdout).group(1)


def run_demo(repository: Path, devices: int, timeout_s: float = 400) -> DemoRun:
    """Run the demo from ``repository`` as ``make demo`` does (default work directory), with fewer devices.

    ``repository/notebooks`` is created: where a notebook's kernel runs when opened from the repository.
    """
    (repository / "notebooks").mkdir(parents=True)
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "demo", "--devices", str(devices)],
        cwd=repository,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return DemoRun(repository, result.stdout, result.stderr)
