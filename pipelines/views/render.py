"""Run the notebooks as a user would and keep the charts they display.

    .venv/bin/python -m pipelines.views.render docs/img    # after `make demo`, from the repository

Each notebook runs top to bottom (nbclient) with its kernel in ``notebooks/``, as Jupyter runs it, and with
whatever ``TIMESTONE_*`` settings the environment has (none: the demo's tables). The PNGs it displays are
written under the given directory with the names of :data:`CHARTS`. A notebook that fails (no tables yet)
is said in one line, its name and its error, exit status 1. Needs the ``dev`` extra (nbclient, ipykernel,
matplotlib).
"""

from __future__ import annotations

import base64
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipelines.views.location import find_upwards

#: Every notebook, and the names of the charts it displays, in order.
CHARTS: dict[str, tuple[str, ...]] = {
    "telemetry.ipynb": ("fleet", "device", "fleet_metric", "quality"),
    "ota_rollout.ipynb": ("rollout", "compliance"),
}


@contextmanager
def this_interpreter_kernel() -> Iterator[None]:
    """Make the ``python3`` kernel run this interpreter (not some other Jupyter install's), for the block."""
    from ipykernel.kernelspec import install

    previous = os.environ.get("JUPYTER_PATH")
    with tempfile.TemporaryDirectory(prefix="timestone-kernel-") as prefix:
        install(kernel_name="python3", prefix=prefix)
        os.environ["JUPYTER_PATH"] = os.path.join(prefix, "share", "jupyter")
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = previous


def execute(notebook: Any, cwd: Path, timeout_s: int = 300) -> Any:
    """Run ``notebook`` (an nbformat notebook, changed in place) with its kernel in ``cwd``; errors raise."""
    from nbclient import NotebookClient

    with this_interpreter_kernel():
        client = NotebookClient(
            notebook, kernel_name="python3", timeout=timeout_s, resources={"metadata": {"path": str(cwd)}}
        )
        client.execute()
    return notebook


def displayed_pngs(notebook: Any) -> list[bytes]:
    """The PNG images an executed notebook displayed, in order."""
    return [
        base64.b64decode(output["data"]["image/png"])
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]


def main(argv: list[str]) -> int:
    import nbformat

    out = Path(argv[0] if argv else "docs/img")
    notebooks = find_upwards(Path("notebooks"))
    if notebooks is None:
        print("no notebooks/ directory here or above: run from the repository", file=sys.stderr)
        return 2
    from nbclient.exceptions import CellExecutionError

    out.mkdir(parents=True, exist_ok=True)
    for name, charts in CHARTS.items():
        try:
            notebook = execute(nbformat.read(notebooks / name, as_version=4), notebooks)
        except CellExecutionError as error:  # the notebook's own error (no tables yet...): one line, no stack
            print(f"{name}: {error.ename}: {error.evalue}", file=sys.stderr)
            return 1
        images = displayed_pngs(notebook)
        if len(images) != len(charts):
            print(f"{name} displayed {len(images)} charts, expected {len(charts)}", file=sys.stderr)
            return 1
        for chart, image in zip(charts, images, strict=True):
            (out / f"{chart}.png").write_bytes(image)
            print(f"{out / chart}.png  ({name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
