"""The store's identity: a random id in ``meta/STORE_ID``, made once per data directory and never changed.

Offsets are only meaningful within one store: a data directory wiped or replaced (a device swapped, a disk
lost) starts its logs at offset 0 again. Readers that keep offsets (the Spark source's checkpoints) compare
the identity the offsets API tells with the one their offsets were taken from, and so see a replaced store.

The id (128 random bits, 32 lowercase hex digits) is written when the store first opens a directory without
one: a new directory, or one of an earlier version; and again, replacing it, when ``log/`` is gone or
emptied (the logs, and their offsets, start anew beside the old id). It is written like ``meta/LAYOUT``: to
a ``.tmp`` file, synced, renamed, the directory synced, so a crash leaves either no id (made at the next
open, before any record is served) or the whole one. A damaged file (which no crash leaves) is replaced by
a new id, said at ERROR: readers then see a new store, which is safe where keeping a wrong id would not be.
"""

from __future__ import annotations

import logging
import os
import re
import secrets

from .layout import STORE_ID_FILE, write_meta_file

__all__ = ["STORE_ID_FILE", "ensure_store_id", "read_store_id"]

log = logging.getLogger(__name__)

_STORE_ID = re.compile(r"[0-9a-f]{32}")


def read_store_id(meta: str) -> str | None:
    """The id in ``meta/STORE_ID`` (None: no file, or not an id)."""
    try:
        with open(os.path.join(meta, STORE_ID_FILE), encoding="ascii", errors="replace") as file:
            text = file.read(64).strip()
    except FileNotFoundError:
        return None
    return text if _STORE_ID.fullmatch(text) else None


def ensure_store_id(meta: str, *, log_is_new: bool = False) -> str:
    """The store's id, made and written durably first if ``meta/`` has none (see the module docstring).

    ``log_is_new``: the partition logs are made anew (``log/`` deleted or emptied), so offsets start again
    at 0: an id already in ``meta/`` named the store that was lost, and a new one replaces it."""
    found = read_store_id(meta)
    if found is not None and not log_is_new:
        return found
    path = os.path.join(meta, STORE_ID_FILE)
    if found is not None:
        log.warning(
            "%s names store %s, but the partition logs beside it are gone (log/ deleted or emptied): a new "
            "store id is written; readers holding offsets of the old store will see a new store",
            path,
            found,
        )
    elif os.path.exists(path):
        log.error("%s is damaged (not a store id): a new id is written; readers will see a new store", path)
    store_id = secrets.token_hex(16)
    write_meta_file(meta, STORE_ID_FILE, store_id)
    return store_id
