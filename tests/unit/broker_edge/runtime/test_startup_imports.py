"""What ``timestone broker`` has imported once its MQTT listener accepts: the broker, and nothing more.

Each case runs a real broker in a fresh interpreter (the command's own path: ``pipelines.cli`` routes to
``broker_edge.runtime.main``, whose ``serve`` starts the broker on free ports) and reads ``sys.modules`` the
moment it is ready. Whatever is in that set was paid for before the first client could connect, so the HTTP
stack, YAML without a file, the Arrow side and the pipelines' dependencies must not be; each is loaded on
first use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]

NEVER_AT_START = {
    "aiohttp",  # the admin endpoint and the offsets API load it with their first connection
    "multidict",
    "yarl",
    "numpy",  # the first columnar read of the commitlog
    "pyarrow",  # the first Arrow fetch of the offsets API
    "pandas",
    "pyspark",
    "deltalake",
    "great_expectations",
    "paho",
    "getpass",  # the passwd command's
    "prometheus_client",  # the first scrape of /metrics
    "crc32c",  # the commitlog's first checksum (its package reads its version with importlib.metadata)
    "importlib.metadata",
    "ctypes",  # the store's syncfs question, asked when its first log opens
    "platform",
    "broker_edge.offsets_api.server",
    "broker_edge.runtime.admin_http",
    "broker_edge.runtime.transports.websocket",
    "pipelines.runner",
    "sources",
    "sinks",
}

_START = """
import asyncio, json, os, signal, sys

import pipelines.cli  # the console script's module, as `timestone broker` runs it
from broker_edge.settings.broker import load_broker_config
from broker_edge.runtime.main import serve

config = load_broker_config(sys.argv[2] if len(sys.argv) > 2 else None)
config.listeners[0].port = 0
config.offsets_api.port = 0
config.admin_http.port = 0
config.storage.directory = sys.argv[1]


async def main():
    ready = asyncio.Event()
    broker = asyncio.ensure_future(serve(config, ready))
    await ready.wait()
    loaded = sorted(sys.modules)
    os.kill(os.getpid(), signal.SIGTERM)
    await broker
    print(json.dumps(loaded))


import uvloop

uvloop.run(main())
"""


def modules_when_listening(tmp_path: Path, config: Path | None = None) -> set[str]:
    """``sys.modules`` of a fresh broker process the moment its listeners accept (then it stops)."""
    argv = [sys.executable, "-c", _START, str(tmp_path / "data")] + ([str(config)] if config else [])
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def _loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(module.startswith(name + ".") for module in modules)


@pytest.fixture(scope="module")
def default_modules(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return modules_when_listening(tmp_path_factory.mktemp("defaults"))


def test_a_default_broker_listens_with_the_broker_loaded(default_modules):
    """The set is read from a broker that really started: its own modules and the event loop are in it."""
    assert {
        "broker_edge.runtime.broker",
        "broker_edge.runtime.transports.tcp",
        "broker_edge.storage",
        "uvloop",
    } <= (default_modules)


@pytest.mark.parametrize("name", sorted(NEVER_AT_START))
def test_a_default_broker_listens_without(default_modules, name):
    assert not _loaded(default_modules, name), f"{name} is imported before the broker listens"


def test_yaml_is_read_only_for_a_config_file(default_modules, tmp_path):
    assert not _loaded(default_modules, "yaml")
    config = tmp_path / "broker.yaml"
    config.write_text("logging:\n  level: WARNING\n")
    with_file = modules_when_listening(tmp_path, config)
    assert "yaml" in with_file
    assert not any(_loaded(with_file, name) for name in NEVER_AT_START)
