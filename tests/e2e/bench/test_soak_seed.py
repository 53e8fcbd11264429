"""The store a soak starts from: the devices' logs exist and continue at offsets reached after days."""

from __future__ import annotations

from bench.footprint_startup import DefaultTimestone, seed_logs
from bench.soak_bench import LOGS_FROM
from bench.soak_load import device_topic
from broker_edge.storage import LogStore
from broker_edge.storage.config import StorageConfig


def test_seeded_logs_continue_at_the_offset_and_take_appends_after_it(tmp_path):
    topics = [device_topic(index) for index in range(3)]
    seed_logs(tmp_path / "data", topics, LOGS_FROM)
    with LogStore(tmp_path / "data", StorageConfig()) as store:
        assert sorted(store.topics()) == sorted(topics)
        info = store.log_info(topics[1])
        assert (info.start_offset, info.end_offset) == (LOGS_FROM, LOGS_FROM + 1)
        assert store.append_message(topics[1], b"telemetry", 1) == LOGS_FROM + 1


def test_the_broker_under_test_seeds_its_data_directory_before_it_starts(tmp_path):
    (tmp_path / "data").mkdir()
    broker = DefaultTimestone(logs=[device_topic(0)], logs_from=LOGS_FROM)
    command = broker.command(1883, tmp_path)
    assert "broker" in command
    with LogStore(tmp_path / "data", StorageConfig()) as store:
        assert store.log_info(device_topic(0)).start_offset == LOGS_FROM
    assert "continue at offset 1,000,000" in broker.config_notes()
