"""Interoperability with other clients: gmqtt, Mosquitto's command line clients, MQTT.js over WebSocket."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from gmqtt import Client as GmqttClient

from tests.broker.broker_test_clients import PahoClient

JS_DIR = Path(__file__).parent / "js"
JS_CACHE = Path(os.environ.get("TIMESTONE_JS_CACHE", Path.home() / ".cache" / "timestone-mqttjs"))


def test_gmqtt_v5(broker):
    async def scenario() -> list:
        received: list = []
        done = asyncio.Event()
        client = GmqttClient("gmqtt-client")

        def on_message(client, topic, payload, qos, properties):
            received.append((topic, payload, qos))
            done.set()
            return 0

        client.on_message = on_message
        await client.connect("127.0.0.1", broker.port, keepalive=30)
        client.subscribe("gm/#", qos=1)
        await asyncio.sleep(0.1)  # gmqtt's subscribe does not return the SUBACK
        client.publish("gm/x", b"via gmqtt", qos=1)
        await asyncio.wait_for(done.wait(), 5)
        await client.disconnect()
        return received

    assert asyncio.run(scenario()) == [("gm/x", b"via gmqtt", 1)]


def test_mosquitto_pub_and_sub(broker):
    sub = subprocess.Popen(
        [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(broker.port),
            "-t",
            "mq/#",
            "-q",
            "1",
            "-C",
            "2",
            "-v",
            "-V",
            "5",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("mq/#", 1)
    # wait until mosquitto_sub's subscription is in place
    for _ in range(200):
        if broker.call(lambda: broker.broker.router.trie.count) >= 2:
            break
        subprocess.run(["sleep", "0.02"])
    for version, payload in (("311", "from-v311"), ("5", "from-v5")):
        subprocess.run(
            [
                "mosquitto_pub",
                "-h",
                "127.0.0.1",
                "-p",
                str(broker.port),
                "-t",
                "mq/t",
                "-m",
                payload,
                "-q",
                "2",
                "-V",
                version,
            ],
            check=True,
            timeout=10,
        )
    out, _ = sub.communicate(timeout=10)
    assert out.splitlines() == ["mq/t from-v311", "mq/t from-v5"]
    assert [m.payload for m in watcher.expect(2)] == [b"from-v311", b"from-v5"]


@pytest.fixture(scope="session")
def mqttjs() -> Path:
    """node_modules with MQTT.js, installed once into a cache directory from tests/broker/js/package.json."""
    assert shutil.which("node") and shutil.which("npm"), "node and npm are required for the MQTT.js test"
    JS_CACHE.mkdir(parents=True, exist_ok=True)
    wanted = (JS_DIR / "package.json").read_text()
    cached = JS_CACHE / "package.json"
    if (
        not (JS_CACHE / "node_modules" / "mqtt").is_dir()
        or not cached.exists()
        or cached.read_text() != wanted
    ):
        cached.write_text(wanted)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=JS_CACHE, check=True, timeout=300)
    return JS_CACHE / "node_modules"


@pytest.mark.parametrize("version", [4, 5])
def test_mqttjs_over_websocket(start_broker, mqttjs, version):
    broker = start_broker(
        listeners=[
            {"name": "tcp", "port": 0},
            {"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/mqtt"},
        ]
    )
    tcp = PahoClient(broker.port, "tcp-side")
    tcp.subscribe("js/t", 1)
    url = f"ws://127.0.0.1:{broker.port_of('ws')}/mqtt"
    result = subprocess.run(
        ["node", str(JS_DIR / "pubsub.js"), url, "js/t", str(version)],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "NODE_PATH": str(mqttjs)},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip()) == {"topic": "js/t", "payload": "hello from mqtt.js", "qos": 1}
    assert tcp.expect(1)[0].payload == b"hello from mqtt.js"


def test_paho_over_websocket(start_broker):
    broker = start_broker(
        listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/mqtt"}]
    )
    import paho.mqtt.client as mqtt

    client = PahoClient(broker.port, "ws-paho", connect=False)
    client.client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id="ws-paho", protocol=mqtt.MQTTv5, transport="websockets"
    )
    client.client.ws_set_options(path="/mqtt")
    client.client.on_message = lambda c, u, m: client.messages.put(m)
    client.client.on_connect = lambda c, u, f, rc, p: client.connack.put((f, rc, p))
    client.client.on_subscribe = lambda c, u, mid, rcs, p: client.subacks.put((mid, rcs))
    client.connect()
    client.subscribe("ws/#", 2)
    for qos in (0, 1, 2):
        client.publish("ws/x", f"q{qos}", qos)
    assert [m.payload for m in client.expect(3)] == [b"q0", b"q1", b"q2"]
