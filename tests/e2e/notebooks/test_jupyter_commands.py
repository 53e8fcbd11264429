"""The Jupyter commands docs/notebooks.md gives, run as written on the demo's tables: each notebook executes
top to bottom in the `.venv`'s kernel and its HTML holds what it printed and the charts it drew."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "notebooks.md"
BIN = Path(sys.executable).parent


def documented_commands() -> list[list[str]]:
    """The ``.venv/bin/jupyter ...`` lines of the doc's "Opening and running them" block."""
    section = DOC.read_text(encoding="utf-8").split("## Opening and running them", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [
        shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.startswith(".venv/bin/")
    ]


def test_jupyter_lab_and_nbconvert_are_installed():
    commands = documented_commands()
    assert [command[:2] for command in commands] == [
        [".venv/bin/jupyter", "lab"],
        [".venv/bin/jupyter", "nbconvert"],
        [".venv/bin/jupyter", "nbconvert"],
    ]
    for tool in ("lab", "nbconvert"):
        assert subprocess.run([str(BIN / "jupyter"), tool, "--version"], capture_output=True).returncode == 0


@pytest.mark.parametrize("notebook", ["telemetry", "ota_rollout"])
def test_the_documented_nbconvert_command_runs_a_notebook_on_the_demo_tables(demo_run, tmp_path, notebook):
    command = next(c for c in documented_commands() if f"notebooks/{notebook}.ipynb" in c)
    shutil.copy(REPO / "notebooks" / f"{notebook}.ipynb", demo_run.repository / "notebooks")
    argv = [str(BIN / "jupyter"), *command[1:]]
    argv[argv.index("/tmp/notebooks")] = str(tmp_path)
    result = subprocess.run(argv, cwd=demo_run.repository, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    html = (tmp_path / f"{notebook}.html").read_text(encoding="utf-8")
    assert f"tables under {demo_run.repository / '.timestone' / 'demo' / 'tables'} (delta-rs)" in html
    assert html.count('src="data:image/png;base64,') >= (3 if notebook == "telemetry" else 2)
    assert "Traceback" not in html
    if notebook == "ota_rollout":
        assert demo_run.phased_action_id in html


def test_rendering_the_charts_without_tables_says_why_in_one_line(tmp_path):
    """``python -m pipelines.views.render docs/img`` before any ``make demo``: the notebook's own error, in
    one line naming the notebook, where its cell and the runner's stack were printed (60 lines)."""
    shutil.copytree(REPO / "notebooks", tmp_path / "notebooks")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMESTONE_")}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.views.render", str(tmp_path / "img")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "------" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "telemetry.ipynb: FileNotFoundError: no tables at .timestone/demo/tables: run `make demo` in the "
        "repository, or set TIMESTONE_TABLES to a tables root"
    )


def test_the_documented_install_brings_every_module_the_notebooks_import():
    """docs/notebooks.md said ``pip install 'timestone[pipelines,notebooks]'`` outside the repository: the
    notebooks' first cell then failed, the table code importing pyspark, which neither extra brings."""
    import json
    import re

    from pipelines.cli import OPTIONAL_MODULES

    (extras,) = re.findall(r"pip install\s+'timestone\[([\w,]+)\]'", DOC.read_text(encoding="utf-8"))
    cells = [
        json.loads((REPO / "notebooks" / name).read_text())
        for name in ("telemetry.ipynb", "ota_rollout.ipynb")
    ]
    imports = [
        line
        for notebook in cells
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
        for line in cell["source"]
        if line.startswith(("import ", "from "))
    ]
    script = (
        "import sys\n"
        + "".join(imports)
        + "\nprint(' '.join(sorted(set(m.split('.')[0] for m in sys.modules))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, check=True
    )
    needed = {OPTIONAL_MODULES[module] for module in loaded.stdout.split() if module in OPTIONAL_MODULES}
    assert needed - set(extras.split(",")) == set()


def test_the_commands_the_ota_notebook_names_are_the_docs_as_written():
    """ota_rollout.ipynb's part 3 said to run ``timestone broker`` ... after ``make demo``, which puts no
    ``timestone`` on the PATH (the command is ``.venv/bin/timestone``): a command not found."""
    import json
    import re

    section = DOC.read_text(encoding="utf-8").split("## Creating an action from the notebook", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    written = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    notebook = json.loads((REPO / "notebooks" / "ota_rollout.ipynb").read_text())
    (part_3,) = [cell for cell in notebook["cells"] if cell["source"][0].startswith("## 3. Create an action")]
    text = "".join(part_3["source"])
    named = re.findall(r"`((?:\S*/)?timestone [^`]+)`", text.replace("\n", " "))
    assert named
    assert [command for command in named if not any(line.startswith(command) for line in written)] == []
