"""Broker logging: text for people, JSON lines for log shippers, and the client id on every connection line.

A broker log is read when one device misbehaves among thousands, so each line a connection writes carries
``client_id``, ``listener`` and ``peer`` (``connection_logger``), in both formats: in text as trailing
``key=value`` pairs, in JSON as fields. Any ``extra={...}`` given at the call site is kept the same way.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from broker_edge.config import ConfigError

__all__ = [
    "ConnectionLoggerAdapter",
    "JsonFormatter",
    "LoggingConfig",
    "TextFormatter",
    "configure_logging",
    "connection_logger",
]

CONNECTION_LOGGER = "broker_edge.connection"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Attributes every LogRecord has; anything else on a record came from ``extra`` and is a field.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
# What a client may put in its id, user name or topics that a terminal or a line reader acts on: C0 and C1
# controls (ANSI escapes, NUL), line and paragraph separators, bidi and zero-width format characters.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]")


@dataclass
class LoggingConfig:
    """How the broker writes its log (to standard error)."""

    level: str = "INFO"
    """Lowest level written: DEBUG, INFO, WARNING, ERROR or CRITICAL."""
    format: Literal["text", "json"] = "text"
    """``text`` for terminals, ``json`` for one JSON object per line (log shippers)."""

    def __post_init__(self) -> None:
        if not isinstance(self.level, str) or self.level.upper() not in _LEVELS:
            raise ConfigError("level", f"expected one of {', '.join(_LEVELS)}, got {self.level!r}")
        self.level = self.level.upper()
        if self.format not in ("text", "json"):
            raise ConfigError("format", f"expected 'text' or 'json', got {self.format!r}")


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then every extra field (client_id, ...)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extra_fields(record).items():
            document.setdefault(key, value)
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return _escape_unsafe(json.dumps(document, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """``2026-11-21T08:50:43.123Z INFO logger: message client_id=d1 listener=tcp peer=...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _escape_unsafe(record.message)  # one line, whatever a client id or topic holds
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _extra_fields(record)
        if not fields:
            return line
        pairs = " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())
        head, newline, rest = line.partition("\n")  # keep a traceback below the fields
        return f"{head} {pairs}{newline}{rest}"


def _text_value(value: Any) -> str:
    text = str(value)
    if not text or _UNSAFE.search(text) or any(c.isspace() or c in '"=' for c in text):
        return _escape_unsafe(json.dumps(text, ensure_ascii=False))
    return text


def _escape_unsafe(text: str) -> str:
    """``text`` with each character of ``_UNSAFE`` written as a JSON escape (``\\n``, ``\\u001b``)."""
    return _UNSAFE.sub(lambda match: json.dumps(match.group())[1:-1], text)


_handler: logging.Handler | None = None


def configure_logging(
    config: LoggingConfig, stream: TextIO | None = None, node: str | None = None
) -> logging.Handler:
    """Install the broker's handler on the root logger (standard error unless ``stream``); with ``node``,
    every line carries it as the field ``node`` (the members of ``timestone broker --workers`` share one
    standard error).

    Calling it again (configuration reload) replaces the handler this function installed before and
    leaves other handlers alone, such as pytest's capture handler.
    """
    global _handler
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if config.format == "json" else TextFormatter())
    if node is not None:

        def name_the_node(record: logging.LogRecord) -> bool:
            record.node = node
            return True

        handler.addFilter(name_the_node)
    root.addHandler(handler)
    root.setLevel(config.level)
    _handler = handler
    return handler


class ConnectionLoggerAdapter(logging.LoggerAdapter):
    """Adds the connection's fields to every record, merged with (not replacing) a call's own ``extra``."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        own = kwargs.get("extra")
        extra = dict(self.extra or {})
        kwargs["extra"] = {**extra, **own} if own else extra
        return msg, kwargs

    def bind(self, **fields: Any) -> ConnectionLoggerAdapter:
        """The same logger with more fields, e.g. the username once CONNECT is authenticated."""
        return ConnectionLoggerAdapter(self.logger, {**(self.extra or {}), **fields})


def connection_logger(client_id: str, listener: str, peer: str) -> ConnectionLoggerAdapter:
    """The logger of one client connection; every line it writes carries these three fields."""
    fields: Mapping[str, Any] = {"client_id": client_id, "listener": listener, "peer": peer}
    return ConnectionLoggerAdapter(logging.getLogger(CONNECTION_LOGGER), dict(fields))
