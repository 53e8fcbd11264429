"""Fixtures of the broker suite: a real Broker on 127.0.0.1 port 0, on its own thread's event loop (uvloop, or
the standard one with ``runtime={"event_loop": "asyncio"}``).

The broker runs on a background thread so that the tests can drive it with ordinary blocking clients
(paho-mqtt, raw sockets, subprocesses) exactly as devices would. ``start_broker(**sections)`` builds a
``BrokerConfig`` from keyword sections (``limits={...}``, ``storage={...}``) the way YAML would, so tests use
the same loader and validation as production.

``brokers(name, **sections)`` starts a broker with its commitlog and offsets API on, whose logs live in
``tmp_path / name`` (several may run side by side); the default durability is the production default.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import uvloop

from broker_edge.config import load_dataclass
from broker_edge.runtime.broker import Broker
from broker_edge.settings.broker import BrokerConfig
from tests.e2e.broker_clients import close_all
from tests.e2e.tuned_collector import collector_tuned_as_a_broker


class RunningBroker:
    """A started broker and the thread running its loop; ``call`` runs a function on that loop."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.loop = (
            asyncio.new_event_loop() if config.runtime.event_loop == "asyncio" else uvloop.new_event_loop()
        )
        self.broker = Broker(config)
        self._thread = threading.Thread(target=self._run, name="broker", daemon=True)
        self._started: Future = Future()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.broker.start())
        except BaseException as exc:  # surface bind/config errors in the test
            self._started.set_exception(exc)
            return
        self._started.set_result(None)
        self.loop.run_forever()

    def start(self) -> RunningBroker:
        self._thread.start()
        self._started.result(timeout=10)
        return self

    def stop(self) -> None:
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.broker.stop(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()

    @property
    def port(self) -> int:
        return self.broker.ports[self.config.listeners[0].name]

    def port_of(self, name: str) -> int:
        return self.broker.ports[name]

    def call(self, function: Callable[[], Any], timeout: float = 5) -> Any:
        """Run ``function()`` on the broker's loop and return its result (the router is not thread-safe)."""
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(function())
            except BaseException as exc:
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout=timeout)

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the broker's Prometheus registry (counters flushed first); 0 when absent."""

        def read() -> float:
            self.broker.flush_stats()
            return self.broker.metrics.registry.get_sample_value(name, labels) or 0.0

        return self.call(read)

    def drops(self, reason: str) -> int:
        return int(self.metric("timestone_broker_messages_dropped_total", reason=reason))

    def refused(self, reason: str) -> int:
        return int(self.metric("timestone_broker_connections_refused_total", reason=reason))

    def disconnects(self, reason: str) -> int:
        return int(self.metric("timestone_broker_disconnects_total", reason=reason))

    def tick(self, seconds: float) -> None:
        """Run the router's timers (delayed wills, session expiry) as if ``seconds`` had passed: the
        sweep hands times in as numbers, so tests need not wait for them."""
        router = self.broker.router
        self.call(lambda: router.tick(self.broker.loop.time() + seconds))

    def connected(self, client_id: str) -> bool:
        """Whether a connection of ``client_id`` is open on the broker."""
        return self.call(lambda: any(c.client_id == client_id for c in self.broker.connections))

    def connection(self, client_id: str) -> Any:
        """The broker's ``Connection`` of ``client_id`` (touch it only through ``call``)."""
        return self.call(lambda: next(c for c in self.broker.connections if c.client_id == client_id))


BROKER_FEATURES = ("mqtt", "security", "limits", "observability", "refusals")
"""Feature folders whose tests drive one broker with MQTT clients (no Spark, no long runs)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A broker test that hangs fails after 60 s, not after the suite-wide 300: every wait there has its own
    timeout, so reaching this one means a bug to look at (the dump shows where)."""
    folders = [Path(__file__).parent / name for name in BROKER_FEATURES]
    for item in items:
        in_folder = any(folder in Path(item.path).parents for folder in folders)
        if in_folder and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(60))


def broker_config(tmp_path: Path | None = None, **sections: Any) -> BrokerConfig:
    """A test config: listener and admin HTTP on port 0, storage off unless given, then ``sections``."""
    document: dict[str, Any] = {
        "listeners": [{"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0}],
        "admin_http": {"port": 0},
        "storage": {"enabled": False},
        "offsets_api": {"enabled": False},
        "sys_topics": {"enabled": False},
    }
    if "storage" in sections and tmp_path is not None:
        sections["storage"] = {
            "directory": str(tmp_path / "logs"),
            "durability": "none",
            **sections["storage"],
        }
        sections.setdefault("offsets_api", {"enabled": False})
    document.update(sections)
    return load_dataclass(BrokerConfig, document)


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., RunningBroker]]:
    """``start_broker(**sections)`` → a running broker, stopped at the end of the test."""
    running: list[RunningBroker] = []

    def start(**sections: Any) -> RunningBroker:
        broker = RunningBroker(broker_config(tmp_path, **sections)).start()
        running.append(broker)
        return broker

    yield start
    close_all()  # clients first: none may outlive the test (or reconnect into a later one)
    for broker in running:
        broker.stop()


@pytest.fixture
def broker(start_broker: Callable[..., RunningBroker]) -> RunningBroker:
    """A broker with the test defaults (anonymous loopback listener, no commitlog)."""
    return start_broker()


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


@pytest.fixture
def tuned_collector() -> Iterator[None]:
    """This process's collector tuned as a broker process's for one test (`collector_tuned_as_a_broker`):
    a bound on an in-process broker's loop stalls then holds the broker's, not the test heap's."""
    with collector_tuned_as_a_broker():
        yield


@pytest.fixture(scope="session")
def project_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheels of this checkout and of its base and cluster dependencies (``pip wheel '.[cluster]'``),
    made once per test session: what an installation without an index (the image's build, with the cluster
    extra; a gateway's install, without) installs from."""
    import subprocess
    import sys

    wheels = tmp_path_factory.mktemp("wheels")
    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), f"{root}[cluster]"],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return wheels
