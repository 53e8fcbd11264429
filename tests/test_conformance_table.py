"""docs/conformance.md gives every normative statement of MQTT 5.0 and 3.1.1 the tests that cover it, or why
it does not apply, and agrees with the tests' ``mqtt5`` / ``mqtt311`` markers; docs/sparkplug-conformance.md
does the same for the Sparkplug B statements that apply to a host application and to an MQTT server
(``sparkplug`` markers), where a row may also say why a statement is not met.

Markers are read from the test files' syntax trees (no collection, no imports): a decorator
``@pytest.mark.mqtt5("MQTT-3.3.2-17", ...)`` on a ``test_*`` function marks it as covering those statements.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.mqtt_statements import MQTT_3_1_1, MQTT_5
from tests.sparkplug_statements import SPARKPLUG_B

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "conformance.md"
SPARKPLUG_DOC = ROOT / "docs" / "sparkplug-conformance.md"
#: marker → (its document, the heading of its table, the specification's statements in order)
VERSIONS = {
    "mqtt5": (DOC, "## MQTT 5.0", MQTT_5),
    "mqtt311": (DOC, "## MQTT 3.1.1", MQTT_3_1_1),
    "sparkplug": (SPARKPLUG_DOC, "## Sparkplug B 3.0", SPARKPLUG_B),
}
ROW = re.compile(r"^\| (MQTT-\d+\.\d+\.\d+-\d+|tck-id-[a-z0-9-]+) \| [^|]* \| (.+) \|$")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
NOT_APPLICABLE = "n/a: "
NOT_MET = "not met: "


def table_rows(marker: str) -> list[tuple[str, str]]:
    """(statement, coverage cell) of every row in the version's section, in order."""
    doc, heading, _ = VERSIONS[marker]
    rows: list[tuple[str, str]] = []
    inside = False
    for line in doc.read_text().splitlines():
        if line.startswith("## "):
            inside = line.strip() == heading
        elif inside and (match := ROW.match(line)):
            rows.append((match.group(1), match.group(2)))
    return rows


def marked_tests() -> tuple[set[str], dict[tuple[str, str], set[str]]]:
    """Every test function (``path::name``) and, per (marker, statement), the tests that carry it."""
    tests: set[str] = set()
    marked: dict[tuple[str, str], set[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.name.startswith(
                "test"
            ):
                continue
            name = f"{relative}::{node.name}"
            tests.add(name)
            for decorator in node.decorator_list:
                marker = _marker_name(decorator)
                if marker in VERSIONS and isinstance(decorator, ast.Call):
                    for argument in decorator.args:
                        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                            marked.setdefault((marker, argument.value), set()).add(name)
    return tests, marked


def _marker_name(decorator: ast.expr) -> str | None:
    """``mqtt5`` for ``@pytest.mark.mqtt5(...)``, else None."""
    if not isinstance(decorator, ast.Call) or not isinstance(decorator.func, ast.Attribute):
        return None
    owner = decorator.func.value
    if isinstance(owner, ast.Attribute) and owner.attr == "mark":
        return decorator.func.attr
    return None


TESTS, MARKED = marked_tests()


@pytest.mark.parametrize("marker", VERSIONS)
def test_the_table_lists_every_statement_once_in_the_spec_order(marker):
    statements = [statement for statement, _ in table_rows(marker)]
    assert statements == list(VERSIONS[marker][2])


def test_markers_name_only_statements_of_the_spec():
    unknown = sorted(
        f"{marker}({statement}) on {', '.join(sorted(tests))}"
        for (marker, statement), tests in MARKED.items()
        if statement not in VERSIONS[marker][2]
    )
    assert unknown == []


@pytest.mark.parametrize("marker", VERSIONS)
def test_every_statement_has_tests_or_a_reason_and_the_table_agrees_with_the_markers(marker):
    problems: list[str] = []
    for statement, cell in table_rows(marker):
        named = {f"{path}::{name}" for path, name in TEST_REF.findall(cell)}
        carrying = MARKED.get((marker, statement), set())
        reason = next((prefix for prefix in (NOT_APPLICABLE, NOT_MET) if cell.startswith(prefix)), None)
        if reason == NOT_MET and marker != "sparkplug":
            problems.append(f"{statement}: a statement of MQTT is met or does not apply")
        if reason is not None:
            if len(cell) < len(reason) + 20:
                problems.append(f"{statement}: the reason is missing")
            if carrying:
                problems.append(f"{statement}: marked as covered by {sorted(carrying)} but said `{reason}`")
            continue
        if not named:
            problems.append(f"{statement}: neither a test nor a reason")
        problems += [f"{statement}: {test} does not exist" for test in sorted(named - TESTS)]
        problems += [f"{statement}: {test} lacks @pytest.mark.{marker}" for test in sorted(named - carrying)]
        problems += [f"{statement}: {test} is marked but not listed" for test in sorted(carrying - named)]
    assert problems == []


def test_the_summary_counts_what_the_table_says():
    for marker, (doc, heading, statements) in VERSIONS.items():
        rows = table_rows(marker)
        not_applicable = sum(cell.startswith(NOT_APPLICABLE) for _, cell in rows)
        not_met = sum(cell.startswith(NOT_MET) for _, cell in rows)
        covered = len(statements) - not_applicable - not_met
        version = heading.removeprefix("## ")
        counts = [len(statements), covered, not_applicable] + ([not_met] if marker == "sparkplug" else [])
        assert f"| {version} | {' | '.join(map(str, counts))} |" in doc.read_text()
