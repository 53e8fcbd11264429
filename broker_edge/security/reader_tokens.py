"""Readers' bearer tokens for the offsets API: several, each limited to topic filters, reloaded on SIGHUP.

A reader (the Spark source, the OTA jobs, a notebook, a tool) presents ``Authorization: Bearer <token>``.
Each token is a ``ReaderToken``: a name (what logs say, never the secret), the secret, and the topic
filters it may read (``plant-a/#``: a notebook given that token cannot list or fetch ``plant-b/...``).
Tokens come from ``offsets_api.token`` (one token reading every topic, the older setting),
``offsets_api.tokens`` and the file ``offsets_api.tokens_file``, which SIGHUP reads again: a rotation adds
the new token, reloads, moves the readers, removes the old one and reloads again, with both accepted in
between. A file that does not load keeps the tokens in force (the error names the file and the field).

A token never makes its holder a member of a cluster: members prove who they are with their certificate on
their own endpoint (``broker_edge.cluster.links.member_api``), which knows nothing of tokens.

Secrets are kept as SHA-256 digests and looked up by the digest of what a request presents, so the lookup
takes the same time whichever token (if any) matches.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from broker_edge.config.loader import ConfigError, load_dataclass, load_yaml_file, sourced
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.topics import validate_topic_filter
from broker_edge.security.access import Access

__all__ = ["ReaderToken", "ReaderTokens", "TokensFile"]

log = logging.getLogger("broker_edge.reader_tokens")

EVERY_TOPIC = ("#",)


@dataclass
class ReaderToken:
    """One reader's token and what it may read."""

    name: str
    """Who holds it (a job, a notebook): what logs and errors name; never the secret."""
    token: str
    """The secret presented as ``Authorization: Bearer <token>``."""
    topics: list[str] = field(default_factory=lambda: list(EVERY_TOPIC))
    """Topic filters it may list and read (MQTT wildcards); ``#`` (the default) is every topic."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("name", "must not be empty")
        if not isinstance(self.token, str) or not self.token or self.token != self.token.strip():
            raise ConfigError("token", "must not be empty nor start or end with whitespace")
        if not self.topics:
            raise ConfigError("topics", "at least one topic filter (# for every topic)")
        for index, topic_filter in enumerate(self.topics):
            try:
                validate_topic_filter(topic_filter)
            except InvalidTopic as error:
                raise ConfigError(f"topics[{index}]", str(error)) from None
            if topic_filter.startswith("$share/"):
                raise ConfigError(f"topics[{index}]", "a shared subscription is not a topic filter here")


@dataclass
class TokensFile:
    """The layout of ``offsets_api.tokens_file``."""

    tokens: list[ReaderToken] = field(default_factory=list)


def _digest(secret: str) -> bytes:
    """The secret's SHA-256. A header's bytes that are not UTF-8 (aiohttp keeps them as surrogates) are
    hashed as sent: they match no token, where encoding them failed with a 500."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


class ReaderTokens:
    """The tokens in force: ``access(authorization_header)`` is what the request may read, or None."""

    def __init__(self, inline: list[ReaderToken], file: str | None = None) -> None:
        self._inline = list(inline)
        self.file = file
        self._by_digest: dict[bytes, Access] = {}
        self._install(self._inline + (self._read_file() if file else []))

    @property
    def names(self) -> list[str]:
        return sorted(access.name for access in self._by_digest.values())

    def access(self, authorization: str | None) -> Access | None:
        """The access of a request's ``Authorization`` header (None: no token, or not one of these)."""
        secret = _bearer(authorization)
        return self._by_digest.get(_digest(secret)) if secret else None

    def holds_token(self, authorization: str | None) -> bool:
        """Whether a request's ``Authorization`` header carries one of these tokens: asked before the
        request's turn of the loop's HTTP work (a token holder's goes before a stranger's), its handling
        asks ``access`` again."""
        secret = _bearer(authorization)
        return bool(secret) and _digest(secret) in self._by_digest

    def reload(self) -> int:
        """Read ``file`` again (SIGHUP): the tokens in force are the inline ones plus the file's. A file that
        does not load raises ``ConfigError`` and the previous tokens stay. Returns how many are in force."""
        if self.file:
            self._install(self._inline + self._read_file())
        return len(self._by_digest)

    def _install(self, tokens: list[ReaderToken]) -> None:
        by_digest: dict[bytes, Access] = {}
        names: set[str] = set()
        for token in tokens:
            if token.name in names:
                raise ConfigError("tokens", f"two tokens are named {token.name!r}")
            names.add(token.name)
            digest = _digest(token.token)
            if digest in by_digest:
                raise ConfigError(
                    "tokens", f"{token.name!r} has the same secret as {by_digest[digest].name!r}"
                )
            by_digest[digest] = Access(token.name, tuple(token.topics))
        self._by_digest = by_digest

    def _read_file(self) -> list[ReaderToken]:
        assert self.file is not None
        path = Path(self.file)
        try:
            mode = path.stat().st_mode
        except OSError as error:
            raise ConfigError("tokens_file", f"cannot read {path}: {error}") from None
        if mode & stat.S_IRWXO and os.name == "posix":  # the service's group may read it (0640)
            log.warning(
                "reader tokens file %s is readable by every user (mode %o): use 0600, or 0640 with the group "
                "of the broker's user",
                path,
                stat.S_IMODE(mode),
            )
        try:
            return load_dataclass(TokensFile, load_yaml_file(path)).tokens
        except ConfigError as error:  # its key, then the file and the key's line there
            raise sourced(error, path) from None


def _bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header ("" for none, or another scheme)."""
    scheme, _, secret = (authorization or "").partition(" ")
    return secret.strip() if scheme.lower() == "bearer" else ""
