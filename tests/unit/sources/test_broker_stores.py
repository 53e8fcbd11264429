"""The store a broker's offsets were taken from (``#s<id>``): recorded, adopted, and a replaced store
refused or read from its start, never resumed at the old store's offsets."""

from __future__ import annotations

import logging

import pytest

from sources.broker_stores import (
    StoreReplacedError,
    answer_store_matches,
    batch_bounds,
    resumed_start,
    store_key,
    store_of,
    with_stores,
)
from sources.partition_offsets import reads_partitions

A, B = "a" * 32, "b" * 32


def test_the_store_key_names_the_store_and_says_nothing_of_how_a_broker_is_read() -> None:
    by_topic = {store_key(A): 0, "plant/1/temp": 5}
    assert store_of(by_topic) == A and store_of({"plant/1/temp": 5}) is None
    assert reads_partitions(by_topic) is False
    assert reads_partitions({"#p0": 3, store_key(A): 0}) is True
    assert reads_partitions({store_key(A): 0}) is None


def test_the_same_store_goes_on_and_an_old_checkpoint_adopts_the_current_one() -> None:
    start = {"edge": {store_key(A): 0, "t": 5}, "old": {"t": 7}}
    current = {"edge": A, "old": B}
    assert resumed_start(start, current, True) == {"edge": {"t": 5}, "old": {"t": 7}}
    end = with_stores({"edge": {"t": 9}, "old": {"t": 8}}, start, current)
    assert end == {"edge": {store_key(A): 0, "t": 9}, "old": {store_key(B): 0, "t": 8}}


def test_a_replaced_store_fails_naming_the_broker_and_both_stores() -> None:
    with pytest.raises(StoreReplacedError) as failure:
        resumed_start({"edge": {store_key(A): 0, "t": 5}}, {"edge": B}, True)
    assert f"broker 'edge' now serves store {B}, not store {A}" in str(failure.value)
    assert "failOnDataLoss=false" in str(failure.value)


def test_without_fail_on_data_loss_a_replaced_store_is_read_from_its_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        start = resumed_start({"edge": {store_key(A): 0, "#p0": 50}, "down": {"t": 1}}, {"edge": B}, False)
    assert start == {"down": {"t": 1}}  # the replaced broker's logs are new to the query
    assert "its logs are read from their start" in caplog.text
    end = {"edge": {store_key(B): 0, "#p0": 12}, "down": {store_key(A): 0, "t": 1}}
    planned_start, planned_end = batch_bounds({"edge": {store_key(A): 0, "#p0": 50}}, end, {"edge": B}, True)
    assert planned_start == {} and planned_end == {"edge": {"#p0": 12}, "down": {"t": 1}}


def test_a_broker_down_keeps_its_store_and_one_with_no_logs_yet_names_it() -> None:
    start = {"down": {store_key(A): 0, "t": 4}}
    assert with_stores({"down": {"t": 4}}, start, {"empty": B}) == {
        "down": {store_key(A): 0, "t": 4},
        "empty": {store_key(B): 0},
    }


def test_a_batch_replayed_after_its_store_was_replaced_fails_or_reads_nothing_of_it() -> None:
    start = {"edge": {store_key(A): 0, "t": 5}}
    end = {"edge": {store_key(A): 0, "t": 9}}
    assert batch_bounds(start, end, {"edge": A}, True) == ({"edge": {"t": 5}}, {"edge": {"t": 9}})
    with pytest.raises(StoreReplacedError):
        batch_bounds(start, end, {"edge": B}, True)
    assert batch_bounds(start, end, {"edge": B}, False) == ({}, {})


def test_an_answer_from_another_store_is_refused_unknown_ones_are_not() -> None:
    assert answer_store_matches("edge", A, A, True)
    assert answer_store_matches("edge", None, B, True) and answer_store_matches("edge", A, None, True)
    assert not answer_store_matches("edge", A, B, False)
    with pytest.raises(StoreReplacedError):
        answer_store_matches("edge", A, B, True)
