"""``timestone pki issue --out``: where the certificate and its key go when ``--out`` names a directory, or
nothing. Run as a process, on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.broker_edge.pki.test_other_tools_cas import files, pki


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    """A CA made by ``timestone pki ca``."""
    directory = tmp_path / "ca"
    assert pki("ca", str(directory)).returncode == 0
    return directory


@pytest.mark.parametrize("slash", ["", "/"], ids=["dir", "dir-slash"])
def test_out_naming_a_directory_writes_the_files_in_it(tmp_path: Path, ca: Path, slash: str) -> None:
    """``--out /etc/timestone/tls/`` wrote ``/etc/timestone/tls.pem`` and ``tls.key`` beside the directory,
    where no configuration looked, exit 0."""
    tls = tmp_path / "tls"
    tls.mkdir()
    done = pki("issue", "client", "d1", "--ca", str(ca), "--out", f"{tls}{slash}")
    assert done.returncode == 0, done
    assert done.stdout.startswith(f"wrote {tls / 'client-d1.pem'} and {tls / 'client-d1.key'} (0600)\n")
    assert sorted(p.name for p in tls.iterdir()) == ["client-d1.key", "client-d1.pem"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca", "tls"]


def test_out_naming_nothing_is_a_wrong_command_line(tmp_path: Path, ca: Path) -> None:
    """``--out ""`` (a variable not set in a script) stopped with a ValueError traceback."""
    before = files(tmp_path)
    done = pki("issue", "client", "d1", "--ca", str(ca), "--out", "")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines()[-1] == (
        "timestone pki issue: error: argument --out: a path is needed (PATH.pem and PATH.key, or a directory)"
    )
    assert files(tmp_path) == before
