"""A logging handler that keeps what the broker's loggers write, for a test to assert on."""

from __future__ import annotations

import logging


class KeptRecords(logging.Handler):
    """Keeps every record of ``level`` or above it is given, in ``records``."""

    def __init__(self, level: int, records: list[logging.LogRecord] | None = None) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = [] if records is None else records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self) -> list[str]:
        """Each kept record's message."""
        return [record.getMessage() for record in self.records]
