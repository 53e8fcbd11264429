"""The broker as a process: ``timestone broker [--config FILE]`` serving MQTT, /metrics, /health, $SYS topics
and the offsets API, refusing bad configuration with a message that names the key, stopping on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from broker_edge.config import ConfigError
from broker_edge.security.auth import anonymous_allowed
from broker_edge.settings.broker import BrokerConfig, load_broker_config
from tests.conftest import free_port
from tests.e2e.broker_clients import PahoClient

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(sys.executable).with_name("timestone")
TIMESTONE = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "pipelines.cli"]
"""The installed ``timestone`` command (``pipelines.cli:main``), or the same entry point through ``-m``."""
DEFAULT_PORTS = (1883, 9883, 9884)
"""MQTT, admin HTTP and offsets API ports of the default configuration."""


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*TIMESTONE, "broker", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} not open")


def wait_for_started(process: subprocess.Popen) -> list[str]:
    """Read standard error up to the broker's ``broker started`` line (it then serves); the lines read."""
    lines: list[str] = []
    while not lines or "broker started" not in lines[-1]:
        line = process.stderr.readline()
        assert line, "".join(lines)  # the broker ended without starting
        lines.append(line)
    return lines


def stop(process: subprocess.Popen) -> str:
    """SIGTERM, wait for a clean exit (status 0); returns standard error."""
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=15)
    assert process.returncode == 0, err
    return err


def test_timestone_broker_with_yaml_config(tmp_path):
    mqtt_port, admin_port, api_port = free_port(), free_port(), free_port()
    config = {
        "listeners": [{"name": "main", "type": "tcp", "host": "127.0.0.1", "port": mqtt_port}],
        "admin_http": {"port": admin_port},
        "offsets_api": {"port": api_port},
        "storage": {"directory": str(tmp_path / "data")},
        "sys_topics": {"interval_s": 1},
        "logging": {"format": "json"},
    }
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump(config))
    process = start(["--config", str(path)], tmp_path)
    try:
        wait_for_port(mqtt_port, process)
        sub = PahoClient(mqtt_port, "proc-sub")
        sub.subscribe("p/t", 1)
        sub.subscribe("$SYS/broker/uptime", 0)
        PahoClient(mqtt_port, "proc-pub").publish("p/t", b"through a process", 1)
        messages = sub.expect(2, timeout=5)
        by_topic = {m.topic: m.payload for m in messages}
        assert by_topic["p/t"] == b"through a process"
        assert by_topic["$SYS/broker/uptime"].endswith(b"seconds")
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/health", timeout=5).read())
        assert health["status"] == "ok" and health["listeners"] == {"main": mqtt_port}
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5).read().decode()
        assert 'timestone_broker_messages_received_total{listener="main",qos="1"} 1.0' in metrics
        logs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{api_port}/v1/logs", timeout=5).read())
        assert [(log["topic"], log["end_offset"]) for log in logs["logs"]] == [("p/t", 1)]
        sub.disconnect()
    finally:
        err = stop(process)
    lines = [json.loads(line) for line in err.splitlines()]  # every line is one JSON object
    connection_lines = [line for line in lines if line["logger"] == "broker_edge.connection"]
    assert {line["client_id"] for line in connection_lines} == {"proc-sub", "proc-pub"}
    assert {"connected", "disconnected"} <= {line["msg"].split(":")[0] for line in connection_lines}


def test_defaults_and_the_shipped_config_are_one_anonymous_loopback_listener_on_1883():
    """No file, or conf/broker.yaml: one tcp listener on 127.0.0.1:1883, anonymous because loopback."""
    for config in (load_broker_config(None), load_broker_config(str(REPO / "conf" / "broker.yaml"))):
        [listener] = config.listeners
        assert (listener.type, listener.host, listener.port) == ("tcp", "127.0.0.1", 1883)
        assert anonymous_allowed(listener.allow_anonymous, listener.host)
        assert (config.admin_http.host, config.admin_http.port) == ("127.0.0.1", DEFAULT_PORTS[1])
        assert (config.offsets_api.host, config.offsets_api.port) == ("127.0.0.1", DEFAULT_PORTS[2])


def test_the_shipped_config_serves_anonymous_loopback_clients(tmp_path):
    """conf/broker.yaml as shipped, with only its three ports moved to free ones (tests never take 1883)."""
    config = yaml.safe_load((REPO / "conf" / "broker.yaml").read_text())
    mqtt_port, admin_port, api_port = free_port(), free_port(), free_port()
    config["listeners"][0]["port"] = mqtt_port
    config["admin_http"]["port"] = admin_port
    config["offsets_api"]["port"] = api_port
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump(config))
    process = start(["--config", str(path)], tmp_path)  # the default commitlog directory is relative
    try:
        wait_for_port(mqtt_port, process)
        sub = PahoClient(mqtt_port, "anonymous-sub", version=4)
        sub.subscribe("d/t", 1)
        PahoClient(mqtt_port, "anonymous-pub").publish("d/t", b"defaults work", 1)
        assert sub.expect(1)[0].payload == b"defaults work"
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/health", timeout=5).read())
        assert health["listeners"] == {"default": mqtt_port}
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.2", mqtt_port)) != 0  # bound to 127.0.0.1 only
        sub.disconnect()
    finally:
        stop(process)
    assert (tmp_path / "timestone-data").is_dir()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("limits:\n  max_conections: 5\n", "limits.max_conections"),
        ("limits:\n  max_connections: many\n", "limits.max_connections"),
        ("listeners:\n  - {name: a, port: 1883.5}\n", "listeners[0].port"),
        ("retain:\n  enabled: 'yes'\n", "retain.enabled"),
        ("sys_topics:\n  interval_s: [1]\n", "sys_topics.interval_s"),
        ("acl:\n  rules:\n    - {permission: allow, action: all, topik: a}\n", "acl.rules[0].topik"),
        ("listeners:\n  - {name: lan, host: 0.0.0.0, port: 1883}\n", "listeners[0]"),
        ("mqtt:\n  outgoing_topic_aliases: -1\n", "mqtt.outgoing_topic_aliases"),
        ("storage:\n  group_commit_ms: -1\n", "storage.group_commit_ms"),
        ("storage:\n  segment_bytes: 0\n", "storage.segment_bytes"),
        ("storage:\n  retention_ms: 0\n", "storage.retention_ms"),
    ],
)
def test_configuration_errors_name_the_key(tmp_path, text, key):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_broker_config(path)
    assert error.value.path == key


def test_configuration_error_exits_2_with_the_key_on_standard_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("limits:\n  max_connections: many\n")
    result = subprocess.run(
        [*TIMESTONE, "broker", "--config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "configuration error: limits.max_connections: expected int, got str 'many'" in result.stderr


def test_an_empty_configuration_file_name_is_said_as_such():
    """``--config ''`` (a variable that was not set): it said "cannot read the file: Is a directory"."""
    result = subprocess.run(
        [*TIMESTONE, "broker", "--config", ""], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert result.stderr == "timestone broker: configuration error: the configuration file's name is empty\n"


def test_shipped_conf_broker_yaml_is_exactly_the_defaults():
    assert load_broker_config(REPO / "conf" / "broker.yaml") == BrokerConfig()


def test_a_leading_tilde_in_a_path_setting_is_the_home_directory(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "passwd").write_text("")  # no users yet: read, and anonymous loopback clients still connect
    mqtt_port, admin_port, api_port = free_port(), free_port(), free_port()
    config = {
        "listeners": [{"name": "main", "port": mqtt_port}],
        "admin_http": {"port": admin_port},
        "offsets_api": {"port": api_port},
        "storage": {"directory": "~/timestone-data"},
        "auth": {"password_file": "~/passwd"},
    }
    path = work / "broker.yaml"
    path.write_text(yaml.safe_dump(config))
    environment = {**os.environ, "HOME": str(home)}
    process = subprocess.Popen(
        [*TIMESTONE, "broker", "--config", str(path)],
        cwd=work,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(mqtt_port, process)
        PahoClient(mqtt_port, "tilde-pub").publish("home/t", b"kept at home", 1)
    finally:
        err = stop(process)
    assert f"data directory {home / 'timestone-data'} (locked by this broker)" in err
    assert (home / "timestone-data" / "log").is_dir()
    assert not (work / "~").exists()  # no directory named ~ in the working directory


def test_sighup_says_what_it_reads_again_and_that_a_changed_configuration_file_waits_for_a_restart(tmp_path):
    """``systemctl reload`` after an edit of the broker's file: SIGHUP re-reads the files the configuration
    names, not the configuration itself, and said nothing at all; a changed limit looked applied. It now says
    what it re-read, and at WARNING that the changed file's settings apply at the next start."""
    mqtt_port = free_port()
    config = tmp_path / "broker.yaml"
    text = (
        f"listeners: [{{name: tcp, host: 127.0.0.1, port: {mqtt_port}}}]\n"
        "admin_http: {port: 0}\noffsets_api: {port: 0}\n"
        f"storage: {{directory: {tmp_path / 'data'}}}\nlimits: {{max_connections: 100}}\n"
    )
    config.write_text(text)
    process = start(["--config", str(config)], tmp_path)
    wait_for_started(process)  # from then on a SIGHUP is acted on at once, not noted until the start ends
    process.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    config.write_text(text.replace("100", "200"))
    process.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    err = stop(process)

    said = [line.split(" ", 1)[1] for line in err.splitlines() if "SIGHUP" in line]
    assert said == [
        "INFO broker_edge.main: SIGHUP: nothing to read again (no password, ACL or tokens file, no "
        "certificate); the configuration file's settings apply at the next start",
        "INFO broker_edge.main: SIGHUP: nothing to read again (no password, ACL or tokens file, no "
        "certificate); the configuration file's settings apply at the next start",
        f"WARNING broker_edge.main: SIGHUP: {config} changed since the broker started: its settings apply at "
        "the next start (a restart), SIGHUP reads again only the files it names",
    ], err


def test_a_configuration_read_from_a_pipe_serves_and_a_sighup_does_not_wait_on_the_pipe(tmp_path):
    """``--config <(make-config)`` or a FIFO: read once at start; nothing reads it again (a FIFO opened again
    waits for a writer that never comes: the broker would never have served)."""
    import threading

    mqtt_port = free_port()
    fifo = tmp_path / "broker.fifo"
    os.mkfifo(fifo)
    text = (
        f"listeners: [{{name: tcp, host: 127.0.0.1, port: {mqtt_port}}}]\n"
        f"admin_http: {{port: 0}}\noffsets_api: {{port: 0}}\nstorage: {{directory: {tmp_path / 'data'}}}\n"
    )
    writer = threading.Thread(target=fifo.write_text, args=(text,), daemon=True)
    writer.start()
    process = start(["--config", str(fifo)], tmp_path)
    wait_for_port(mqtt_port, process)
    process.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    err = stop(process)
    assert "SIGHUP: nothing to read again" in err and "changed since" not in err
