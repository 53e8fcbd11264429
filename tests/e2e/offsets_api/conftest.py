"""Fixtures of the offsets API tests: a served store, open or token-protected, with sample records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.offsets_api.api_harness import TOKEN, ApiHarness, sample_record


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiHarness]:
    """An open API over a store holding `plant/1/temp` (10 records) and `plant/2/temp` (3 records)."""
    harness = ApiHarness(tmp_path / "store")
    harness.append("plant/1/temp", *(sample_record(n) for n in range(10)))
    harness.append("plant/2/temp", *(sample_record(n) for n in range(3)))
    yield harness
    harness.close()


@pytest.fixture
def secured_api(tmp_path: Path) -> Iterator[ApiHarness]:
    """The same data behind a bearer token."""
    harness = ApiHarness(tmp_path / "store", token=TOKEN)
    harness.append("plant/1/temp", *(sample_record(n) for n in range(10)))
    yield harness
    harness.close()
