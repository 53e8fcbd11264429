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

from tests.e2e.broker_clients import TIMEOUT, PahoClient, wait_for

JS_DIR = Path(__file__).parent / "js"
JS_CACHE = Path(os.environ.get("TIMESTONE_JS_CACHE", Path.home() / ".cache" / "timestone-mqttjs"))


@pytest.mark.mqtt311("MQTT-7.0.0-2")
def test_gmqtt_v5_every_qos(broker):
    async def scenario() -> list:
        received: list = []
        done = asyncio.Event()
        subscribed = asyncio.Event()
        client = GmqttClient("gmqtt-client")

        def on_message(client, topic, payload, qos, properties):
            received.append((topic, payload, qos))
            if len(received) == 3:
                done.set()
            return 0

        client.on_message = on_message
        client.on_subscribe = lambda *args: subscribed.set()
        await client.connect("127.0.0.1", broker.port, keepalive=30)
        client.subscribe("gm/#", qos=2)
        await asyncio.wait_for(subscribed.wait(), TIMEOUT)
        for qos in (0, 1, 2):
            client.publish(f"gm/{qos}", f"via gmqtt {qos}".encode(), qos=qos)
        await asyncio.wait_for(done.wait(), TIMEOUT)
        await client.disconnect()
        return received

    assert asyncio.run(scenario()) == [(f"gm/{qos}", f"via gmqtt {qos}".encode(), qos) for qos in (0, 1, 2)]


def mosquitto(tool: str, port: int, *args: str) -> list[str]:
    return [tool, "-h", "127.0.0.1", "-p", str(port), *args]


@pytest.mark.mqtt311("MQTT-7.0.0-2")
def test_mosquitto_pub_and_sub(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("mq/#", 1)
    sub = subprocess.Popen(
        mosquitto("mosquitto_sub", broker.port, "-t", "mq/#", "-q", "1", "-C", "2", "-v", "-V", "5"),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: broker.call(lambda: broker.broker.router.trie.count) == 2)
        for version, payload in (("311", "from-v311"), ("5", "from-v5")):
            pub = mosquitto("mosquitto_pub", broker.port, "-t", "mq/t", "-m", payload, "-q", "2")
            subprocess.run([*pub, "-V", version], check=True, timeout=10)
        out, _ = sub.communicate(timeout=10)
    finally:
        sub.kill()
    assert out.splitlines() == ["mq/t from-v311", "mq/t from-v5"]
    assert [m.payload for m in watcher.expect(2)] == [b"from-v311", b"from-v5"]


def test_mosquitto_retained_and_clear(broker):
    def retained_now() -> list[str]:
        """What a v3.1.1 mosquitto_sub gets as retained; a live message on mqr/end makes it exit."""
        sub = subprocess.Popen(
            mosquitto("mosquitto_sub", broker.port, "-t", "mqr/#", "-v", "-V", "311", "--retained-only"),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert wait_for(lambda: broker.call(lambda: broker.broker.router.trie.count) == 1)
            subprocess.run(
                mosquitto("mosquitto_pub", broker.port, "-t", "mqr/end", "-n"), check=True, timeout=10
            )
            out, _ = sub.communicate(timeout=10)
        finally:
            sub.kill()
        assert wait_for(lambda: broker.call(lambda: broker.broker.router.trie.count) == 0)
        return out.splitlines()

    publish = mosquitto("mosquitto_pub", broker.port, "-t", "mqr/lamp", "-q", "1", "-r")
    subprocess.run([*publish, "-m", "on"], check=True, timeout=10)
    assert retained_now() == ["mqr/lamp on"]
    subprocess.run([*publish, "-n"], check=True, timeout=10)  # empty retained payload: clears it
    assert retained_now() == []


NPM_FILES = ("package.json", "package-lock.json")


@pytest.fixture(scope="session")
def mqttjs() -> Path:
    """node_modules holding MQTT.js at the version tests/e2e/mqtt/js/package.json (and its lock) pin.

    CI installs it next to the script (``.ci/system-deps``: tests/e2e/mqtt/js/node_modules); elsewhere it is
    installed once into a cache directory, again whenever the pinned files change.
    """
    assert shutil.which("node"), "node is required for the MQTT.js test (.ci/system-deps installs it)"
    if (JS_DIR / "node_modules" / "mqtt").is_dir():
        return JS_DIR / "node_modules"
    assert shutil.which("npm"), "npm is required to install MQTT.js (.ci/system-deps installs it)"
    JS_CACHE.mkdir(parents=True, exist_ok=True)
    stale = not (JS_CACHE / "node_modules" / "mqtt").is_dir()
    for name in NPM_FILES:
        wanted = (JS_DIR / name).read_text()
        cached = JS_CACHE / name
        if not cached.exists() or cached.read_text() != wanted:
            cached.write_text(wanted)
            stale = True
    if stale:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS_CACHE, check=True, timeout=300)
    return JS_CACHE / "node_modules"


def test_mqttjs_is_the_pinned_version(mqttjs):
    pinned = json.loads((JS_DIR / "package.json").read_text())["dependencies"]["mqtt"]
    assert pinned[0].isdigit(), f"pin an exact mqtt version, not {pinned!r}"
    assert json.loads((mqttjs / "mqtt" / "package.json").read_text())["version"] == pinned


@pytest.mark.parametrize("version", [4, 5])
def test_mqttjs_over_websocket(start_broker, mqttjs, version):
    """MQTT.js publishes three messages over WebSocket and receives them; a TCP client receives them too.
    With MQTT 5 both sides use topic aliases after the first message."""
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
        ["node", str(JS_DIR / "pubsub.js"), url, "js/t", str(version), "3"],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "NODE_PATH": str(mqttjs)},
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    sent = [(m["sent"], m["alias"]) for m in lines if "sent" in m]
    received = [m for m in lines if "received" in m]
    assert [(m["received"], m["payload"], m["qos"]) for m in received] == [
        ("js/t", f"hello {i} from mqtt.js", 1) for i in range(3)
    ]
    if version == 5:  # the first PUBLISH each way sets alias 1, the next ones use it alone
        assert sent == [("js/t", 1), ("", 1), ("", 1)]
        assert [m["alias"] for m in received] == [1, 1, 1]
    else:
        assert sent == [("js/t", None)] * 3
        assert [m["alias"] for m in received] == [None] * 3
    assert [m.payload for m in tcp.expect(3)] == [f"hello {i} from mqtt.js".encode() for i in range(3)]
    assert broker.disconnects("protocol_error") == broker.disconnects("topic_alias_invalid") == 0


@pytest.mark.mqtt311("MQTT-7.1.1-1")
@pytest.mark.mqtt5("MQTT-4.2.0-1")
def test_paho_over_websocket(start_broker):
    broker = start_broker(
        listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/mqtt"}]
    )
    client = PahoClient(broker.port, "ws-paho", transport="websockets", ws_path="/mqtt")
    client.subscribe("ws/#", 2)
    for qos in (0, 1, 2):
        client.publish("ws/x", f"q{qos}", qos)
    assert [(m.payload, m.qos) for m in client.expect(3)] == [(b"q0", 0), (b"q1", 1), (b"q2", 2)]
    v3 = PahoClient(broker.port, "ws-paho-3", version=4, transport="websockets", ws_path="/mqtt")
    v3.subscribe("ws/#", 1)
    client.publish("ws/y", b"to both", 1)
    assert v3.expect(1)[0].payload == client.expect(1)[0].payload == b"to both"
