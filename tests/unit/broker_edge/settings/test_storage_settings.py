"""The commitlog's settings refused at load, naming the key, where a value would hold QoS 1 unanswered."""

from __future__ import annotations

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.settings.broker import BrokerConfig


@pytest.mark.parametrize("key", ["group_commit_ms", "group_commit_min_interval_ms"])
@pytest.mark.parametrize("value", [-1.0, 1000.5, 1.0e300])
def test_a_group_commit_wait_past_a_second_or_below_zero_is_refused(key: str, value: float) -> None:
    with pytest.raises(ConfigError) as refused:
        load_dataclass(BrokerConfig, {"storage": {key: value}})
    assert str(refused.value) == f"storage.{key}: must be within [0, 1000], got {value}"


@pytest.mark.parametrize("key", ["group_commit_ms", "group_commit_min_interval_ms"])
@pytest.mark.parametrize("value", [0, 2, 1000])
def test_a_group_commit_wait_up_to_a_second_loads(key: str, value: float) -> None:
    config = load_dataclass(BrokerConfig, {"storage": {key: value}})
    assert getattr(config.storage, key) == value


@pytest.mark.parametrize("value", [2**63, 99_999_999_999_999_999_999])
def test_a_disk_reserve_no_file_can_hold_is_refused(value: int) -> None:
    """Past a file's largest length the reserve cannot be made: every seal failed on it with a traceback
    (OverflowError), its segment kept in memory, so retention never freed anything."""
    with pytest.raises(ConfigError) as refused:
        load_dataclass(BrokerConfig, {"storage": {"disk_reserve_bytes": value}})
    assert str(refused.value) == (
        f"storage.disk_reserve_bytes: must be below 2**63 (9223372036854775808), a file's largest length, "
        f"got {value}"
    )


def test_a_disk_reserve_of_any_file_length_loads() -> None:
    config = load_dataclass(BrokerConfig, {"storage": {"disk_reserve_bytes": 2**63 - 1}})
    assert config.storage.disk_reserve_bytes == 2**63 - 1


@pytest.mark.parametrize("key", ["retention_ms", "retention_bytes"])
def test_a_rules_null_retention_is_the_storage_one_and_its_refusal_says_so(key: str) -> None:
    """A rule's null retention takes `storage`'s (7 days by default), not no limit: the refusal of a rule's
    bad value told a user to write null "for no limit", and their topics then went after 7 days."""
    storage = {key: 5000, "persist": [{"pattern": "audit/#", key: None}]}
    config = load_dataclass(BrokerConfig, {"storage": storage}).storage
    with pytest.raises(ConfigError) as refused:
        load_dataclass(BrokerConfig, {"storage": {"persist": [{"pattern": "audit/#", key: 0}]}})

    assert getattr(config.log_config(config.persist[0]), key) == 5000
    assert str(refused.value) == (
        f"storage.persist[0].{key}: must be >= 1 (or null: storage.{key} applies; to keep these topics' "
        f"records without limit, make storage.{key} null and give the other rules theirs), got 0"
    )


@pytest.mark.parametrize("value", [86_400.5, 1.0e300])
def test_a_retention_interval_past_a_day_is_refused(value: float) -> None:
    """A pass is also what frees a full disk and makes held seals: an interval of 1e300 s loaded and the
    broker never ran one (records kept past retention, a full disk never freed), without a word."""
    with pytest.raises(ConfigError) as refused:
        load_dataclass(BrokerConfig, {"storage": {"retention_interval_s": value}})
    assert str(refused.value) == (
        f"storage.retention_interval_s: must be within (0, 86400] (a day), got {value}"
    )


@pytest.mark.parametrize("value", [0.1, 60, 86_400])
def test_a_retention_interval_up_to_a_day_loads(value: float) -> None:
    config = load_dataclass(BrokerConfig, {"storage": {"retention_interval_s": value}})
    assert config.storage.retention_interval_s == value


@pytest.mark.parametrize("value", [0, 3, True, "2"])
def test_a_record_format_other_than_1_or_2_is_refused(value: object) -> None:
    with pytest.raises(ConfigError) as refused:
        load_dataclass(BrokerConfig, {"storage": {"record_format": value}})
    assert str(refused.value).startswith("storage.record_format: ")
