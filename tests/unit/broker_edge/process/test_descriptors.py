"""The process's descriptors shared at start: the other needs first, client connections get what is left."""

from __future__ import annotations

import resource

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.process.descriptors import describe_cap, open_descriptors, plan_descriptors
from broker_edge.settings.broker import BrokerConfig

NEEDS = {
    "open at start": 10,
    "reserve": 64,
    "storage.max_open_files": 1026,
    "offsets_api.max_connections": 257,
}


def test_connections_that_fit_are_left_alone():
    budget = plan_descriptors(65_536, 20_000, NEEDS)
    assert (budget.connections, budget.capped_from) == (20_000, None)


def test_the_documented_default_limit_caps_the_default_connections_and_says_why():
    budget = plan_descriptors(20_000, 20_000, NEEDS)
    assert (budget.connections, budget.capped_from) == (20_000 - 1357, 20_000)
    message = describe_cap(budget)
    assert message.startswith(
        "limits.max_connections 20000 does not fit the process's 20000 file descriptors"
    )
    assert "capped to 18643, after storage.max_open_files 1026, offsets_api.max_connections 257" in message


def test_needs_that_leave_no_connection_are_refused_naming_the_largest():
    with pytest.raises(
        ConfigError,
        match=r"^storage\.max_open_files: no file descriptor left .* 1024 .*"
        r"storage\.max_open_files 1026",
    ):
        plan_descriptors(1024, 100, NEEDS)


def test_an_unlimited_process_caps_nothing():
    budget = plan_descriptors(resource.RLIM_INFINITY, 20_000, NEEDS)
    assert budget.connections == 20_000


def test_a_config_names_what_it_needs():
    config = load_dataclass(
        BrokerConfig,
        {
            "listeners": [{"name": "a", "port": 0}, {"name": "b", "port": 0}],
            "storage": {"max_open_files": 100},
        },
    )
    assert config.descriptor_needs() == {
        "listeners": 2,
        "storage.max_open_files": 102,
        "admin_http.max_connections": 65,
        "offsets_api.max_connections": 257,
    }
    assert open_descriptors() > 0
