"""``timestone demo --workdir``: the demo starts afresh in its working directory, and never deletes one of
someone else's to do so."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.demo import WORKDIR_MARK, fresh_workdir


def test_a_directory_of_ones_own_is_refused_and_kept(tmp_path: Path, capsys):
    """``--workdir ~/projects`` (or ``.``): exit status 2 naming it, every file kept, where the demo
    deleted the whole directory before it started."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print('mine')")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as done:
        main(["demo", "--workdir", str(tmp_path)])
    assert done.value.code == 2
    error = capsys.readouterr().err
    assert f"--workdir {tmp_path} is not empty and not a demo's working directory" in error
    assert "(it holds notes.txt, src)" in error
    assert (tmp_path / "src" / "main.py").read_text() == "print('mine')"
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_file_is_refused(tmp_path: Path):
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ValueError, match="is not a directory"):
        fresh_workdir(tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("marked", [True, False])
def test_an_earlier_demos_directory_is_started_afresh(tmp_path: Path, marked: bool):
    """The next demo deletes the last one's data: a directory with the mark, or (an earlier version's,
    unmarked) with nothing but what a demo keeps."""
    workdir = tmp_path / "demo"
    for name in ("broker", "tables", "checkpoints"):
        (workdir / name / "inner").mkdir(parents=True)
    if marked:
        (workdir / WORKDIR_MARK).write_text("")
        (workdir / "derby.log").write_text("")
    fresh_workdir(workdir)
    assert sorted(path.name for path in workdir.iterdir()) == [WORKDIR_MARK]


def test_a_new_or_empty_directory_is_made_the_demos(tmp_path: Path):
    fresh_workdir(tmp_path / "new" / "demo")
    assert (tmp_path / "new" / "demo" / WORKDIR_MARK).is_file()
    (tmp_path / "empty").mkdir()
    fresh_workdir(tmp_path / "empty")
    assert [path.name for path in (tmp_path / "empty").iterdir()] == [WORKDIR_MARK]


def test_a_directory_that_cannot_be_made_is_a_wrong_command_line(tmp_path: Path, capsys):
    """``--workdir`` under a file (or where this user may not write): one line naming it, exit status 2,
    where the demo ended in a NotADirectoryError (PermissionError) traceback."""
    (tmp_path / "file").write_text("mine")
    with pytest.raises(SystemExit) as done:
        main(["demo", "--workdir", str(tmp_path / "file" / "demo")])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"timestone demo: error: --workdir {tmp_path / 'file' / 'demo'}: cannot make it the demo's working "
        "directory: Not a directory"
    )
