"""The actions job that docs/notebooks.md and ota_rollout.ipynb say to start before the notebook writes an
action reads the demo's tables, where the notebook (run from the repository, no setting) writes it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import nbformat
import pytest

from broker_edge.config import load_dataclass
from pipelines.actions.config import ActionsConfig
from pipelines.runner import PIPELINES, load_config_document, parse_args
from pipelines.views.location import DEMO_TABLES, DEMO_WORKDIR

ROOT = Path(__file__).resolve().parents[3]


def job_commands() -> list[tuple[str, str]]:
    """``(where, options)`` of every ``timestone pipeline actions -...`` the two say to run (at least one
    each)."""
    notebook = nbformat.read(ROOT / "notebooks" / "ota_rollout.ipynb", as_version=4)
    part3 = next(cell.source for cell in notebook.cells if cell.source.startswith("## 3. Create an action"))
    docs = (ROOT / "docs" / "notebooks.md").read_text()
    section = docs.split("## Creating an action from the notebook", 1)[1].split("\n## ", 1)[0]
    found = []
    for where, text in (("ota_rollout.ipynb part 3", part3), ("docs/notebooks.md", section)):
        commands = re.findall(r"timestone pipeline actions( -[^`\n#;)]*)", text)  # with options
        assert commands, where
        found += [(where, options.strip()) for options in commands]
    return found


@pytest.mark.parametrize(("where", "options"), job_commands())
def test_the_job_to_start_for_the_notebooks_action_reads_the_demos_tables(where, options, monkeypatch):
    """Both said 'timestone pipeline actions', which reads conf/actions.yaml's tables_root
    (.timestone/tables): the notebook's row, written to the demo's tables, waited for a job that never read
    it, and the notebook ended 'no summary: is the actions job running?' with the job running."""
    monkeypatch.chdir(ROOT)
    args = parse_args(["actions", *shlex.split(options)])
    document = load_config_document(args.config, PIPELINES["actions"].default_config, args.overrides)
    config = load_dataclass(ActionsConfig, document)
    assert Path(config.tables_root) == DEMO_TABLES, where
    assert Path(config.checkpoint_root).is_relative_to(DEMO_WORKDIR), where  # deleted with the tables
