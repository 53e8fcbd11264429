"""The ``runtime`` section: garbage-collector tuning applied once the broker has started."""

from __future__ import annotations

import gc

import pytest

from broker_edge.config.loader import ConfigError
from broker_edge.process.gc_tuning import RuntimeConfig, tune_garbage_collector
from broker_edge.settings.broker import load_broker_config


@pytest.fixture
def restored_gc():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_the_start_up_heap_is_frozen_and_young_collections_are_rarer():
    gc.unfreeze()
    tune_garbage_collector(RuntimeConfig(gc_freeze_at_start=True, gc_young_threshold=12_345))
    assert gc.get_threshold()[0] == 12_345
    assert gc.get_freeze_count() > 1000  # at least the modules, classes and functions loaded so far


@pytest.mark.usefixtures("restored_gc")
def test_zero_and_false_leave_the_interpreter_as_it_is():
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    tune_garbage_collector(RuntimeConfig(gc_freeze_at_start=False, gc_young_threshold=0))
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


@pytest.mark.parametrize("value", [-1, "many", 1.5])
def test_a_bad_threshold_names_the_key(tmp_path, value):
    config = tmp_path / "broker.yaml"
    config.write_text(f"runtime:\n  gc_young_threshold: {value!r}\n")
    with pytest.raises(ConfigError, match=r"runtime\.gc_young_threshold"):
        load_broker_config(config)
