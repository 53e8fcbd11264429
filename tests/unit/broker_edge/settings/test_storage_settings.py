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
