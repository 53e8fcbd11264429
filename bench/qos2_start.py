"""The start after a crash: persistent sessions restored, and the QoS 2 ids the log alone holds found.

A ``LogStore`` on tmpfs (``/dev/shm`` where it exists) with ``--partitions`` partitions; ``--devices``
persistent sessions, each publishing on a topic of its own. Every device appends one QoS 2 record, then the
sessions' snapshot is written (``SessionStore.close``), then ``--messages`` QoS 2 records keeping their packet
ids are appended round-robin over the devices, each but the last ``--window`` held and released in the QoS 2
journal (what a crash leaves since the last snapshot), and the store is dropped without its close (nothing
sealed). Each round opens the store again and restores the sessions with a
fresh router (``SessionStore.restore``): the figures are the process CPU time (``time.process_time``) of the
whole restore and of its step that reads the records since the snapshot (``hold_logged_ids``), the best of
``--rounds``. Runs the code Python finds first, like the ingest bench.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from broker_edge.engine.routing.router import Router
from broker_edge.runtime import session_store
from broker_edge.runtime.qos2_journal import Qos2Journal
from broker_edge.runtime.session_store import SessionStore
from broker_edge.security.limits import LimitsConfig
from broker_edge.settings.broker import SessionsConfig
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.record import qos_with_packet_id

PAYLOAD = b"x" * 100
_NONE = (None,) * 5


def _router(devices: int) -> Router:
    router = Router(LimitsConfig())
    for n in range(devices):
        router.restore_session(f"device-{n}", 300, None, None)
    return router


def _ids(devices: int, first: int, count: int) -> Iterator[tuple[str, int]]:
    """(client id, packet id) of records ``first`` to ``first + count``, one per device in turn."""
    for n in range(first, first + count):
        yield f"device-{n % devices}", n // devices % 65535 + 1


def _append(store: LogStore, devices: int, first: int, count: int) -> None:
    """Records ``first`` to ``first + count`` (``_ids``) on their devices' topics, a loop turn per round."""
    for turn in range(first, first + count, devices):
        ids = _ids(devices, turn, min(devices, first + count - turn))
        store.append_batches(
            [
                (f"fleet/{c}/events", [(PAYLOAD, qos_with_packet_id(2, p), False, c, (), *_NONE)])
                for c, p in ids
            ]
        )
        store.flush()


def _crashed_store(directory: Path, devices: int, messages: int, partitions: int, window: int) -> None:
    """The data directory a crash leaves: the snapshot after one record per device, then ``messages``
    records, each held and released in the journal but the last ``window`` (in flight at the crash)."""
    config = StorageConfig(partitions=partitions)
    store = LogStore(directory, config)
    store.open()
    loop = asyncio.new_event_loop()
    sessions = SessionStore(directory / "meta", _router(devices), store, SessionsConfig(), loop)
    _append(store, devices, 0, devices)
    loop.run_until_complete(sessions.close())
    loop.close()
    _append(store, devices, devices, messages)
    journal = Qos2Journal(directory / "meta")
    for client, packet_id in _ids(devices, devices, messages - window):
        journal.record(client, packet_id, True)
        journal.record(client, packet_id, False)
    journal.close()
    store.file_pool.close()


def _timed(function: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def timed(*args: Any) -> Any:
        began = time.process_time()
        try:
            return function(*args)
        finally:
            spent.append(time.process_time() - began)

    return timed


def measure(devices: int, messages: int, partitions: int, rounds: int, window: int) -> dict[str, Any]:
    """The best round's CPU seconds: the whole restore, and its reading of the records since the snapshot."""
    shm = Path("/dev/shm")
    directory = Path(tempfile.mkdtemp(prefix="qos2-start-", dir=shm if shm.is_dir() else None))
    hold = session_store.hold_logged_ids
    try:
        _crashed_store(directory, devices, messages, partitions, window)
        restores: list[float] = []
        steps: list[float] = []
        held = 0
        vars(session_store)["hold_logged_ids"] = _timed(hold, steps)  # what restore calls, timed
        for _ in range(rounds):
            store = LogStore(directory, StorageConfig(partitions=partitions))
            store.open()
            loop = asyncio.new_event_loop()
            sessions = SessionStore(directory / "meta", _router(devices), store, SessionsConfig(), loop)
            began = time.process_time()
            sessions.restore()
            restores.append(time.process_time() - began)
            held = sum(len(s.incoming_qos2 or ()) for s in sessions.router.sessions.values())
            sessions.journal.close()
            loop.close()
            store.file_pool.close()
        return {"restore_s": min(restores), "ids_step_s": min(steps), "held": held}
    finally:
        vars(session_store)["hold_logged_ids"] = hold
        shutil.rmtree(directory, ignore_errors=True)


def report(devices: int, messages: int, partitions: int, rounds: int, window: int, as_json: bool) -> str:
    """The figures of ``measure``, as a line or one JSON object."""
    figures = measure(devices, messages, partitions, rounds, window)
    figures.update(devices=devices, records=messages, partitions=partitions)
    figures["ids_step_us_per_record"] = round(figures["ids_step_s"] / messages * 1e6, 2)
    if as_json:
        return json.dumps(figures)
    return (
        f"{messages:,} QoS 2 records since the snapshot, {devices:,} device topics, {partitions} partitions: "
        f"restore {figures['restore_s'] * 1e3:.0f} ms CPU, of which the ids found in the log "
        f"{figures['ids_step_s'] * 1e3:.0f} ms ({figures['ids_step_us_per_record']} µs per record); "
        f"{figures['held']:,} ids held"
    )
