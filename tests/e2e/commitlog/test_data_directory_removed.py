"""The data directory removed while the broker runs (``rm -rf`` of storage.directory, a volume's files
wiped): the broker's open descriptors still write into the deleted files, so until 2026-12-01 it went on
acknowledging QoS 1 publishes (PUBACK 0x00) into files no start would ever read, up to the next segment
roll. A publish after the removal is now refused (PUBACK 0x80), ``/health`` says the log failed and names
the deleted file, and nothing is acknowledged that is not in a file of the data directory. The files the
broker writes every interval (the sessions file, the QoS 2 journal, the retained file) each wrote an ERROR
per interval for as long as the directory was missing; each says it once, and says when it works again.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.commitlog.e2e_helpers import health

UNSPECIFIED_ERROR = 0x80


def test_a_publish_after_the_data_directory_is_removed_is_refused_not_acknowledged(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path, limits={"messages_per_second_per_client": 0}) as broker:
        publisher = PahoClient(broker.port, "gateway")
        for number in range(5):
            publisher.publish("fleet/dev-1/t", f"m{number}", 1)
        shutil.rmtree(broker.directory / "data")

        publisher.publish("fleet/dev-1/t", "after", 1, refusal=UNSPECIFIED_ERROR)
        publisher.publish("fleet/dev-2/t", "after", 1, refusal=UNSPECIFIED_ERROR)
        publisher.close()

        with pytest.raises(urllib.error.HTTPError) as answer:
            health(broker)
        assert answer.value.code == 503
        report = json.loads(answer.value.read())
        assert report["status"] == "error"
        assert "deleted while the broker ran" in report["commitlog"]
        assert str(broker.directory / "data" / "log" / "00") in report["commitlog"]
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/metrics", timeout=10) as answer:
            assert b'messages_dropped_total{reason="log_failed"} 2' in answer.read()


SAVERS = {
    "sessions file": "writing persistent sessions to",
    "QoS 2 journal": "writing incoming QoS 2 ids to",
    "retained file": "saving retained messages to",
}
"""What the lines of each file saved every interval begin with (after the logger's name)."""


def _saver_lines(broker: BrokerProcess, level: str, says: str) -> dict[str, int]:
    """How many ``level`` lines of each of ``SAVERS`` saying ``says`` the broker's log holds."""
    lines = [line for line in broker.log_path.read_text().splitlines() if level in line and says in line]
    return {name: sum(start in line for line in lines) for name, start in SAVERS.items()}


def test_the_files_saved_every_interval_say_once_that_the_data_directory_is_gone_and_when_it_is_back(
    tmp_path: Path,
) -> None:
    interval_s = 0.2
    with BrokerProcess(
        tmp_path,
        sessions={"persist_interval_s": interval_s},
        sys_topics={"interval_s": 1},  # the retained set changes every second ($SYS): its file is written
    ) as broker:
        device = PahoClient(broker.port, "gateway", clean=False, session_expiry=3600)
        device.publish("fleet/dev-1/state", "on", 2, retain=True)
        shutil.rmtree(broker.directory / "data")

        assert wait_for(lambda: min(_saver_lines(broker, "ERROR", "failed").values()) == 1, timeout=30)
        time.sleep(15 * interval_s)  # three $SYS updates and fifteen sessions intervals, all failing
        assert _saver_lines(broker, "ERROR", "") == dict.fromkeys(SAVERS, 1)

        (broker.directory / "data" / "meta").mkdir(parents=True)
        assert wait_for(lambda: min(_saver_lines(broker, "WARNING", "works again").values()) == 1, timeout=30)
        device.close()
    assert _saver_lines(broker, "ERROR", "") == dict.fromkeys(SAVERS, 1)
    assert (broker.directory / "data" / "meta" / "sessions.json").exists()
