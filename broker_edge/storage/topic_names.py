"""Reversible, filesystem-safe directory names for arbitrary MQTT topic names.

Short topics are percent-encoded (`sensors/a b` -> `sensors%2Fa%20b`): readable in `ls`, reversible from the
name alone, and free of `/`, NUL, `.`/`..` and hidden names. Topics whose encoding exceeds `MAX_ENCODED`
bytes (filesystems allow 255) become `<encoded prefix>~<sha256 prefix>`, and their full name is kept in a
`TOPIC` file inside the directory. `~` never appears in a plain encoding, so the two forms cannot collide.
"""

from __future__ import annotations

import hashlib
import os
from urllib.parse import quote, unquote

MAX_ENCODED = 200
HASHED_MARK = "~"
TOPIC_FILE = "TOPIC"
_PREFIX_CHARS = 150


def topic_directory_name(topic: str) -> str:
    """The directory name of `topic`'s log."""
    if not topic:
        raise ValueError("an MQTT topic name is at least one character")
    encoded = quote(topic, safe="").replace("~", "%7E")
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    if len(encoded) <= MAX_ENCODED:
        return encoded
    digest = hashlib.sha256(topic.encode()).hexdigest()[:40]
    return f"{encoded[:_PREFIX_CHARS]}{HASHED_MARK}{digest}"


def is_hashed(name: str) -> bool:
    """True when the name is a hashed form whose topic lives in the `TOPIC` file."""
    return HASHED_MARK in name


def topic_from_directory(path: str) -> str:
    """The topic a log directory belongs to (raises `ValueError` for a foreign or damaged directory)."""
    name = os.path.basename(path.rstrip(os.sep))
    if not is_hashed(name):
        topic = unquote(name, errors="strict")
        if topic_directory_name(topic) != name:
            raise ValueError(f"{name!r} is not a topic directory name")
        return topic
    try:
        with open(os.path.join(path, TOPIC_FILE), encoding="utf-8") as file:
            topic = file.read()
    except FileNotFoundError as error:
        raise ValueError(f"{name!r} has no {TOPIC_FILE} file") from error
    if topic_directory_name(topic) != name:
        raise ValueError(f"{TOPIC_FILE} in {name!r} names another topic")
    return topic
