"""The data directory removed while the broker runs (``rm -rf`` of storage.directory, a volume's files
wiped): the broker's open descriptors still write into the deleted files, so until 2026-12-01 it went on
acknowledging QoS 1 publishes (PUBACK 0x00) into files no start would ever read, up to the next segment
roll. A publish after the removal is now refused (PUBACK 0x80), ``/health`` says the log failed and names
the deleted file, and nothing is acknowledged that is not in a file of the data directory.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient
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
