"""A task planned on one store of a broker that answers from another (its data directory replaced between
planning and reading) takes none of the other store's records: it fails (``failOnDataLoss``) or stops."""

from __future__ import annotations

import logging
from dataclasses import replace

import pyarrow as pa
import pytest

from sources.broker_stores import StoreReplacedError
from sources.offsets_planner import Slice
from sources.partition_offsets import position_key
from sources.partition_reader import read_positions
from sources.slice_reader import SOURCE_ARROW_SCHEMA, read_slices
from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.sources.test_slice_reader import settings

OTHER_STORE = "0" * 32


def test_a_task_reading_by_topic_from_another_store_fails_or_takes_nothing(
    edge: EdgeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    edge.fill("plant/1/temp", 10)
    planned = [Slice("plant/1/temp", 0, 10)]
    same = list(read_slices(replace(settings(edge), store=edge.store.store_id), planned))
    assert sum(batch.num_rows for batch in same) == 10
    with pytest.raises(
        StoreReplacedError, match=f"now serves store {edge.store.store_id}, not store {OTHER_STORE}"
    ):
        list(read_slices(replace(settings(edge), store=OTHER_STORE), planned))
    with caplog.at_level(logging.WARNING):
        taken = list(read_slices(replace(settings(edge, fail=False), store=OTHER_STORE), planned))
    assert pa.Table.from_batches(taken, schema=SOURCE_ARROW_SCHEMA).num_rows == 0
    assert "this task reads no more of it" in caplog.text


def test_a_task_reading_by_partition_from_another_store_fails_or_takes_nothing(edge: EdgeBroker) -> None:
    edge.fill("plant/1/temp", 10)
    planned = [Slice(position_key(0), 0, 10)]
    patterns = ("plant/+/temp",)
    same = list(read_positions(replace(settings(edge), store=edge.store.store_id), planned, patterns, {}))
    assert sum(batch.num_rows for batch in same) == 10
    with pytest.raises(StoreReplacedError):
        list(read_positions(replace(settings(edge), store=OTHER_STORE), planned, patterns, {}))
    assert (
        list(read_positions(replace(settings(edge, fail=False), store=OTHER_STORE), planned, patterns, {}))
        == []
    )
    past_its_end = [Slice(position_key(0), 20, 30)]  # an answer refusing the position tells its store too
    with pytest.raises(StoreReplacedError):
        list(read_positions(replace(settings(edge), store=OTHER_STORE), past_its_end, patterns, {}))
