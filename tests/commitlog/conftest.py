"""Fixtures of the end-to-end commitlog proofs: real brokers with their commitlog and offsets API on.

`brokers(name, **sections)` starts an in-process broker (a real `Broker` on its own uvloop thread, real
sockets on 127.0.0.1) whose logs live in `tmp_path / name`; sections are YAML-shaped and go through the
same loader as a config file. The default durability is the production default (`group`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_edge.config import load_dataclass
from broker_edge.config.broker import BrokerConfig
from tests.broker.broker_test_clients import close_all
from tests.broker.conftest import RunningBroker


def broker_document(directory: Path, **sections: Any) -> dict[str, Any]:
    """A broker config document: loopback listener, offsets API and admin HTTP on free ports."""
    document: dict[str, Any] = {
        "listeners": [{"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0}],
        "admin_http": {"port": 0},
        "offsets_api": {"host": "127.0.0.1", "port": 0},
        "sys_topics": {"enabled": False},
        "limits": {"messages_per_second_per_client": 0},
    }
    for key, value in sections.items():
        document[key] = {**document.get(key, {}), **value} if isinstance(value, dict) else value
    document["storage"] = {"directory": str(directory), **sections.get("storage", {})}
    return document


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Callable[..., RunningBroker]]:
    """`brokers(name="a", **sections)` -> a running broker with its logs in `tmp_path / name`."""
    running: list[RunningBroker] = []

    def start(name: str = "a", **sections: Any) -> RunningBroker:
        config = load_dataclass(BrokerConfig, broker_document(tmp_path / name, **sections))
        broker = RunningBroker(config).start()
        running.append(broker)
        return broker

    yield start
    close_all()
    for broker in running:
        broker.stop()
