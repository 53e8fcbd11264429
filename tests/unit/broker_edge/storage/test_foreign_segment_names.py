"""Files in a partition's directory named as segments far past the store's own (a stray copy, another
tool's log named by a 20-digit offset, as Kafka names its segments): until 2026-12-01 the open enumerated
every segment number between the oldest one and such a file's to find the segments missing in the middle,
a dict entry per number, so a start over ``00000000000100000000.log`` took gigabytes and minutes, one over a
number past 2**31 never ended, and nothing said which file. The open now looks only at the numbers a log
still needs (its newest segment's), and a number the store cannot have given (past 2**31 - 1, the sealed
index's field) is not read: the file is left as it is, named in a WARNING.

Each open runs in a child process whose address space is capped, so a regression fails fast instead of
taking the machine's memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker_edge.storage import LogStore, StorageConfig
from tests.unit.broker_edge.storage.log_helpers import make_record

CONFIG = StorageConfig(segment_bytes=4096, retention_ms=None)
MEMORY_CAP = 1 << 30

CHILD = """
import json, logging, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from broker_edge.storage import LogStore, StorageConfig
from tests.unit.broker_edge.storage.log_helpers import make_record
store = LogStore(sys.argv[1], StorageConfig(segment_bytes=4096, retention_ms=None))
report = store.open()
counts = {{topic: len(store.read(topic, 0, max_records=10_000, max_bytes=10**9)) for topic in ("t", "u")}}
for number in range(100):
    store.append("t", make_record(number + 1000))
store.flush()
counts["t after"] = store.log_info("t").end_offset
store.close()
print(json.dumps(counts))
"""


def _filled(directory: Path) -> None:
    store = LogStore(directory, CONFIG)
    store.open()
    for number in range(120):
        store.append("t", make_record(number))
        store.append("u", make_record(number + 500))
    store.close()


def _open_in_child(directory: Path) -> tuple[dict, str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(cap=MEMORY_CAP), str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


@pytest.mark.parametrize("number", [10**8, 3 * 10**9, 10**20 - 1])
def test_a_file_named_as_a_far_segment_neither_hangs_the_start_nor_takes_memory(
    tmp_path: Path, number: int
) -> None:
    data = tmp_path / "data"
    _filled(data)
    stray = data / "log" / "00" / f"{number:020d}.log"
    stray.write_bytes(b"")

    for _ in range(2):  # and again after appends and a clean close
        counts, said = _open_in_child(data)
        assert counts["t"] >= 120 and counts["u"] == 120
        if number >= 2**31:
            assert f"WARNING {stray}: not a segment of this store" in said
            assert stray.exists()  # left as it is
    assert counts["t after"] == 320
