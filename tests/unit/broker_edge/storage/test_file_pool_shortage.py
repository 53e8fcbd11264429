"""A process out of descriptors is a passing shortage for the store's file pool, never a failed write: the
pool closes its idle descriptors and retries. Run in a child process whose ``RLIMIT_NOFILE`` is low."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, resource, sys
    from broker_edge.storage.file_pool import FileHandlePool

    directory = sys.argv[1]
    held = len(os.listdir("/proc/self/fd")) + 24
    resource.setrlimit(resource.RLIMIT_NOFILE, (held, held))
    pool = FileHandlePool(max_open=10_000)  # a bound far above what the process may open
    for number in range(200):
        pool.pwritev(os.path.join(directory, f"{number}.log"), [str(number).encode()], 0)
    print(pool.descriptor_shortages, pool.open_count, held)
    """
)


def test_files_beyond_the_process_limit_are_written_after_idle_descriptors_close(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    shortages, still_open, limit = (int(word) for word in done.stdout.split())
    assert shortages >= 1  # the limit was reached, and taken as a shortage
    assert still_open < limit
    assert "out of file descriptors opening" in done.stderr  # said once, with the settings to look at
    for number in range(200):
        assert (tmp_path / f"{number}.log").read_text() == str(number)
