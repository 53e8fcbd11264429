"""The ``timestone ota`` and ``timestone devices register`` lines of docs/ota.md, run as written on a tables
root of their own: only what the doc leaves to the reader is filled in (a checksum's ``9f2c...`` completed to
64 digits, a ``--url ...`` or ``--sha256 ...`` given a value, ``<action id>`` an action the lines created, an
optional ``[...]`` left out): a line lacking what ``create`` requires fails here as it does for a reader."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pipelines.cli import main
from sinks import open_table_store
from tests.e2e.ota.conftest import register_devices

DOC = Path(__file__).resolve().parents[3] / "docs" / "ota.md"
ELIDED_HEX = re.compile(r"^([0-9a-f]+)\.\.\.$")


def doc_lines(section: str) -> list[str]:
    """The command lines of the first ``bash`` block after ``section``, continuations joined, comments off."""
    text = DOC.read_text(encoding="utf-8").split(section, 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def filled(line: str, root: str, action_id: str | None) -> list[str]:
    line = re.sub(r"\s\[[^\]]*\]", "", line)  # optional parts, left out
    if "<action id>" in line:
        assert action_id is not None, line
        line = line.replace("<action id>", action_id)
    words = shlex.split(line)
    out: list[str] = []
    for word in words:
        if word == "...":
            word = "https://fw.example/fw.bin" if out[-1].endswith("url") else "0" * 64
        elif elided := ELIDED_HEX.match(word):
            word = elided.group(1).ljust(64, "0")
        out.append(word)
    assert out[0] == "timestone", line
    if out[1] == "ota":
        return ["ota", "--tables-root", root, *out[2:]]
    return [*out[1:], "--tables-root", root]


@pytest.mark.parametrize(
    "section",
    ["## Operating it", "### Devices without the telemetry pipeline"],
    ids=["operating", "register"],
)
def test_every_command_line_of_the_doc_runs_as_written(section, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plant-3-devices.txt").write_text("dev-00003\ndev-00004\n")
    (tmp_path / "wave-3.txt").write_text("# wave 3\ndev-00005\ndev-00006\n")
    root = str(tmp_path / "tables")
    store = open_table_store(None, root, backend="delta-rs")
    store.ensure("devices")
    register_devices(store, {"d1": "canary", "d2": "fleet", "d3": "kiosks"})
    lines = [line for line in doc_lines(section) if line.startswith(("timestone ota", "timestone devices"))]
    assert len(lines) >= 3
    action_id = None
    for line in lines:
        status = main(filled(line, root, action_id))
        out, err = capsys.readouterr()
        assert status == 0, (line, err)
        if line.startswith("timestone ota create") and action_id is None:
            action_id = out.split()[0]
