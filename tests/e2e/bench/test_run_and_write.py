"""The ``main`` every output-only benchmark shares: run in a temporary directory, render, write, print."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.report import RESULTS_DIR, extra_sections, output_parser, run_and_write


def test_run_and_write_runs_in_a_fresh_directory_renders_writes_and_prints(tmp_path, capsys) -> None:
    seen: list[Path] = []

    def run(directory: Path) -> int:
        assert directory.is_dir() and not any(directory.iterdir())
        seen.append(directory)
        return 42

    output = tmp_path / "out" / "sessions.md"
    status = run_and_write(
        ["--output", str(output)], "sessions", "Doc line.\n\nmore", run, lambda n, cmd: f"{n} by {cmd}\n"
    )
    assert status == 0
    assert seen[0].name.startswith("timestone-sessions-bench-") and not seen[0].exists()
    expected = "42 by flock /tmp/timestone-bench.lock python -m bench.sessions_bench\n"
    assert output.read_text() == expected
    assert capsys.readouterr().out == expected + "\n" + f"wrote {output}\n"


def test_the_default_output_is_the_benchmarks_results_file(capsys) -> None:
    parser = output_parser(
        "python -m bench.cluster_fanout_bench", "Fanout.\n", RESULTS_DIR / "cluster-fanout.md"
    )
    assert (
        parser.parse_args([]).output
        == Path(__file__).resolve().parents[3] / "bench/results/cluster-fanout.md"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "Fanout." in capsys.readouterr().out


def test_results_md_takes_each_results_file_without_its_earlier_runs(tmp_path) -> None:
    (tmp_path / "a.md").write_text("## A\n\nnow 5\n\n## Earlier runs\n\nwhat it held\n\n### A\n\nthen 3\n")
    (tmp_path / "b.md").write_text("## B\n\nnow 7\n")
    sections = dict(extra_sections(tmp_path))
    assert sections == {"a.md": "## A\n\nnow 5\n", "b.md": "## B\n\nnow 7\n"}
