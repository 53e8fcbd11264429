"""A data directory whose topic catalog is damaged beyond repair (emptied, its header overwritten) or written
by a newer Timestone: ``timestone broker`` does not start, says so in one line naming the file and what to do
(``cannot start: ...``, as for an unknown data directory layout), exits 1 without a traceback, and leaves the
file as it found it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker_edge.storage import LogStore


def start_over(tmp_path: Path, data: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "broker.yaml"
    config.write_text(
        "listeners:\n  - {name: local, port: 0}\n"
        f"storage:\n  directory: {data}\n"
        "admin_http: {port: 0}\noffsets_api: {port: 0}\n"
    )
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def damaged_header(data: Path) -> str:
    catalog = data / "log" / "catalog"
    return (
        f"{catalog} is not a topic catalog of version 1 ({catalog.stat().st_size} bytes, its header "
        f"damaged): put it back from a backup, or move {data} aside to start with an empty store"
    )


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        pytest.param(lambda catalog: catalog.write_bytes(b""), damaged_header, id="emptied"),
        pytest.param(
            lambda catalog: catalog.write_bytes(b"XXXX" + catalog.read_bytes()[4:]),
            damaged_header,
            id="header",
        ),
        pytest.param(
            lambda catalog: catalog.write_bytes(b"TSCT\x02\x00" + catalog.read_bytes()[6:]),
            lambda data: (
                f"{data / 'log' / 'catalog'} is a topic catalog of version 2, and this Timestone reads "
                "version 1: start the Timestone that wrote it"
            ),
            id="newer",
        ),
    ],
)
def test_a_damaged_catalog_stops_the_start_in_one_line_naming_it(tmp_path, damage, said):
    data = tmp_path / "data"
    store = LogStore(data)
    store.open()
    store.close()
    catalog = data / "log" / "catalog"
    damage(catalog)
    damaged = catalog.read_bytes()
    done = start_over(tmp_path, data)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1, output
    assert errors[0].endswith(f"ERROR broker_edge.main: cannot start: {said(data)}")
    assert catalog.read_bytes() == damaged
