"""docs/tables.md lists exactly the declared columns, types, nullability and partitioning of every table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sinks.tables import DEFAULT_CATALOG

DOC = Path(__file__).resolve().parents[3] / "docs" / "tables.md"
ROW = re.compile(r"^\| `([^`]+)` \| `([^`]+)` \| (yes|no) \|")


def documented_tables() -> dict[str, str]:
    """Table name -> its section of the page."""
    sections = re.split(r"^### `([a-z_]+)`\s*$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {sections[i]: sections[i + 1] for i in range(1, len(sections) - 1, 2)}


def test_every_declared_table_is_documented():
    assert set(documented_tables()) == set(DEFAULT_CATALOG)


@pytest.mark.parametrize("name", sorted(DEFAULT_CATALOG))
def test_documented_columns_match_the_declaration(name):
    section = documented_tables()[name]
    rows = [m.groups() for line in section.splitlines() if (m := ROW.match(line))]
    spec = DEFAULT_CATALOG[name]
    declared = [
        (f.name, f.dataType.simpleString(), "yes" if f.nullable else "no") for f in spec.schema.fields
    ]
    assert rows == declared
    if spec.partition_by:
        assert "Partitioned by " + ", ".join(f"`{c}`" for c in spec.partition_by) in section
    else:
        assert "Not partitioned" in section
    for key, value in spec.properties.items():
        assert f"`{key}={value}`" in section
