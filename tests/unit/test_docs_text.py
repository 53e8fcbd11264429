"""Slips the markdown renders without complaint: a line of prose that starts with a colon is the rest of a
bullet whose beginning was lost (it renders as a stray line under the list above it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "conf").rglob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """``(number, line)`` of every line outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def test_no_line_of_prose_starts_with_a_colon() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line[:60]}"
        for path in DOCS
        for number, line in prose_lines(path.read_text())
        if re.match(r"\s*:", line)
    ]
    assert found == []


def test_the_check_reads_prose_and_skips_code() -> None:
    text = "- **Offsets API**: on loopback\n: a listener's rule\n```yaml\n: not prose\n```\n"
    assert [number for number, line in prose_lines(text) if re.match(r"\s*:", line)] == [2]


def test_every_test_a_doc_names_is_there() -> None:
    """``tests/....py`` (and ``::test_name``) named as where a behaviour is tested: the file, and the test
    in it; a moved test leaves the doc pointing at nothing."""
    missing = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name, test in re.findall(r"\b(tests/[\w/.-]+\.py)(?:::(\w+))?", line):
                target = ROOT / name
                if not target.is_file() or (test and not re.search(rf"def {test}\b", target.read_text())):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {name}{'::' + test if test else ''}")
    assert missing == []


def paragraphs(text: str) -> list[tuple[int, str]]:
    """``(first line number, text)`` of every paragraph of prose (lines between blank lines; no code)."""
    found: list[tuple[int, str]] = []
    start, lines = 0, list[str]()
    for number, line in [*prose_lines(text), (0, "")]:
        if line.strip():
            start, lines = (start or number), [*lines, line.strip()]
        elif lines:
            found.append((start, " ".join(lines)))
            start, lines = 0, []
    return found


def test_no_paragraph_is_written_twice_in_a_doc() -> None:
    """A paragraph pasted into a second section as well (security.md's revocation paragraph, in the password
    file's section too, where its 'replaced as above' pointed at nothing): the copies drift apart."""
    twice = []
    for path in DOCS:
        seen: dict[str, int] = {}
        for number, paragraph in paragraphs(path.read_text()):
            opening = paragraph[:200]  # one copy edited since: their openings still match
            if len(opening) == 200 and opening in seen:
                twice.append(f"{path.relative_to(ROOT)}:{number}: also at line {seen[opening]}")
            seen.setdefault(opening, number)
    assert twice == []


def test_a_code_block_closes_on_a_line_of_its_own() -> None:
    """README's "```` ``` They show the demo's ...````": a fence followed by text does not close the block
    (CommonMark), so the rest of the page rendered as code, up to the next fence."""
    found = []
    for path in DOCS:
        fenced = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                if fenced and line.strip() != "```":
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line[:60]}")
                fenced = not fenced
    assert found == []


def test_the_readme_shows_every_chart_the_notebooks_draw() -> None:
    """README shows "the notebooks' charts after one make demo"; the fleet's metric chart, drawn by
    telemetry.ipynb and saved by pipelines.views.render, was neither in docs/img nor in the README."""
    from pipelines.views.render import CHARTS

    readme = (ROOT / "README.md").read_text()
    shown = set(re.findall(r"\(docs/img/(\w+)\.png\)", readme))
    drawn = {name for names in CHARTS.values() for name in names}
    assert shown == drawn
    assert all((ROOT / "docs" / "img" / f"{name}.png").is_file() for name in drawn)
