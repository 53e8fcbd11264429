"""The configuration file a broker started with (``ConfigFile``), and the WARNING a SIGHUP gives when it
changed since (``warn_if_changed``): for a single broker and for ``--workers``' command alike."""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["ConfigFile", "warn_if_changed"]

log = logging.getLogger("broker_edge.main")


class ConfigFile:
    """The configuration file a broker started with, as it was then: a regular file only (a pipe or a FIFO,
    ``--config <(make-config)``, is read once: opened again, a FIFO waits for a writer)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.regular = os.path.isfile(path)
        self.content = self._read()

    def _read(self) -> bytes | None:
        if not os.path.isfile(self.path):  # checked each time: a FIFO put in its place waits for a writer
            return None
        try:
            return Path(self.path).read_bytes()
        except OSError:
            return None

    def changed(self) -> bool:
        """Whether the regular file holds other bytes now (or cannot be read)."""
        return self.regular and self._read() != self.content


def warn_if_changed(source: ConfigFile | None) -> None:
    """At SIGHUP: a WARNING when the configuration file changed since the start: its settings are not read
    again (a reload that looked to apply a changed limit applied nothing)."""
    if source is not None and source.changed():
        log.warning(
            "SIGHUP: %s changed since the broker started: its settings apply at the next start (a restart), "
            "SIGHUP reads again only the files it names",
            source.path,
        )
