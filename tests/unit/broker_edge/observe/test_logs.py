"""Log lines in text and JSON carry the connection's client id, listener and peer, and any extra fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.observe.logs import LoggingConfig, configure_logging, connection_logger


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def run(config: LoggingConfig) -> list[str]:
    stream = io.StringIO()
    configure_logging(config, stream)
    log = connection_logger("sensor-42", "tls", "127.0.0.1:50123")
    log.info("connected keepalive=%d", 60)
    log.debug("hidden at INFO")
    log.warning("dropped", extra={"reason": "queue_full", "topic": "devices/sensor-42/t"})
    log.bind(username="alice").info("authenticated")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("handler failed")
    logging.getLogger("broker_edge.router").info("plain line")
    return stream.getvalue().splitlines()


def test_json_lines_carry_the_connection_fields(restore_root_logger: None) -> None:
    lines = run(LoggingConfig(format="json"))
    records = [json.loads(line) for line in lines]
    assert [r["msg"] for r in records] == [
        "connected keepalive=60",
        "dropped",
        "authenticated",
        "handler failed",
        "plain line",
    ]
    first = records[0]
    assert first["client_id"] == "sensor-42"
    assert first["listener"] == "tls"
    assert first["peer"] == "127.0.0.1:50123"
    assert first["level"] == "INFO"
    assert first["logger"] == "broker_edge.connection"
    assert first["ts"].endswith("+00:00")
    assert records[1]["reason"] == "queue_full" and records[1]["client_id"] == "sensor-42", "extras merge"
    assert records[2]["username"] == "alice"
    assert "ValueError: boom" in records[3]["exc"]
    assert "client_id" not in records[4]


def test_text_lines_carry_the_connection_fields(restore_root_logger: None) -> None:
    lines = run(LoggingConfig(format="text"))
    assert "INFO broker_edge.connection: connected keepalive=60" in lines[0]
    assert lines[0].endswith("client_id=sensor-42 listener=tls peer=127.0.0.1:50123")
    assert "reason=queue_full" in lines[1]
    assert "client_id=sensor-42" in lines[1]
    assert "username=alice" in lines[2]
    assert "Traceback" in "\n".join(lines)
    assert lines[-1].endswith("broker_edge.router: plain line")


def test_text_values_with_spaces_are_quoted(restore_root_logger: None) -> None:
    stream = io.StringIO()
    configure_logging(LoggingConfig(), stream)
    connection_logger("has space", "tcp", "[::1]:1").info("x")
    assert 'client_id="has space"' in stream.getvalue()


def test_reconfiguring_replaces_only_our_handler(restore_root_logger: None) -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    first = configure_logging(LoggingConfig(), io.StringIO())
    second = configure_logging(LoggingConfig(level="debug", format="json"), io.StringIO())
    assert first not in root.handlers and second in root.handlers
    assert len(root.handlers) == before + 1
    assert root.level == logging.DEBUG


def test_config_validation() -> None:
    assert load_dataclass(LoggingConfig, {"level": "warning"}).level == "WARNING"
    with pytest.raises(ConfigError, match=r"^logging\.level: expected one of DEBUG"):
        load_dataclass(LoggingConfig, {"level": "LOUD"}, "logging")
    with pytest.raises(ConfigError, match=r"^logging\.format: expected one of"):
        load_dataclass(LoggingConfig, {"format": "xml"}, "logging")
