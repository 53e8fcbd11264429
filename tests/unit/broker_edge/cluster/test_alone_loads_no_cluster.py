"""A broker without a ``cluster:`` section runs alone and loads nothing of the cluster: no etcd client, no
gRPC, nothing of ``broker_edge.cluster`` (the section's dataclass, which its configuration names, is in
``broker_edge.settings.cluster``)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import asyncio, sys, tempfile
from broker_edge.config import load_dataclass
from broker_edge.settings.broker import BrokerConfig
from broker_edge.runtime.broker import Broker

async def main():
    with tempfile.TemporaryDirectory() as tmp:
        config = load_dataclass(BrokerConfig, {
            "listeners": [{"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0}],
            "storage": {"directory": tmp},
            "offsets_api": {"host": "127.0.0.1", "port": 0},
            "admin_http": {"enabled": False},
        })
        broker = Broker(config)
        await broker.start()
        broker.publish("alone/t", b"x", 1)
        await asyncio.sleep(0.2)
        await broker.stop()

asyncio.run(main())
assert "broker_edge.settings.cluster" in sys.modules
loaded = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("aetcd", "grpc") or (m + ".").startswith("broker_edge.cluster.")
)
print(loaded)
"""


def test_a_broker_alone_loads_nothing_of_the_cluster():
    output = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=60
    )
    assert output.stdout.strip().splitlines()[-1] == "[]"
