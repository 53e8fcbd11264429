"""Every file a setting names, checked before the broker opens anything: one error naming the dotted key.

A missing password file, an unreadable ACL or a certificate that does not match its key would otherwise
surface after the data directory was created and the store opened (or as a traceback), under a bare
``certfile``. Here each file is opened and read once, and a TLS server's certificate, key and CAs are
loaded into a context exactly as the listener will load them, so ``run_broker`` exits 2 with e.g.
``listeners[0].tls.certfile: file not found: /etc/timestone/server.pem`` and nothing on disk changed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from broker_edge.config.loader import ConfigError
from broker_edge.security.tls import TlsConfig, not_for_servers, server_ssl_context

__all__ = ["check_directory", "check_named_files", "check_server_tls"]


def check_named_files(files: Iterable[tuple[str, str | None]]) -> None:
    """``ConfigError`` naming the key of the first ``(dotted key, path)`` whose file cannot be read."""
    for key, path in files:
        if not path:
            continue
        try:
            with open(path, "rb") as file:
                file.read(1)
        except IsADirectoryError:
            raise ConfigError(key, f"is a directory, not a file: {path}") from None
        except FileNotFoundError:
            raise ConfigError(key, f"file not found: {path}") from None
        except OSError as exc:
            raise ConfigError(key, f"cannot read {path}: {exc.strerror or exc}") from None


def check_server_tls(key: str, config: TlsConfig) -> None:
    """Load ``config`` as a TLS server would (certificate, key, CAs); the error names ``key``'s field."""
    check_named_files((f"{key}.{name}", getattr(config, name)) for name in ("certfile", "keyfile", "cafile"))
    try:
        server_ssl_context(config)
    except ConfigError as error:
        raise ConfigError(f"{key}.{error.path}", error.detail) from None
    problem = not_for_servers(config.certfile)
    if problem:
        raise ConfigError(f"{key}.certfile", problem)


def check_directory(key: str, path: str) -> None:
    """``ConfigError`` naming ``key`` when the directory ``path`` cannot be used or made: it, or the nearest
    of its parents that exists, is a file, or is not writable by this process. Nothing is created."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        kind = "a file" if os.path.isfile(existing) else "a broken link or no directory"
        raise ConfigError(key, f"{existing} is {kind}, not a directory: give a directory for {path}")
    if not os.access(existing, os.W_OK | os.X_OK):
        made = "" if existing == os.path.abspath(path) else f" (to make {path} in)"
        raise ConfigError(
            key,
            f"directory {existing}{made} cannot be written by this user (its permissions, or read-only)",
        )
