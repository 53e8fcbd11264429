"""The bench's Timestone from another checkout: that checkout's code serves, under a label of its own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import net
from bench.brokers import BrokerUnavailable, Timestone
from bench.brokers.timestone import REPO


def test_a_checkout_s_broker_runs_that_checkout_s_code(tmp_path: Path) -> None:
    checkout = tmp_path / "older"
    for package in ("broker_edge", "pipelines", "sources", "sinks"):
        shutil.copytree(REPO / package, checkout / package, ignore=shutil.ignore_patterns("__pycache__"))
    with (checkout / "broker_edge" / "__init__.py").open("a") as init:  # says where it was imported from
        init.write("\nimport pathlib\n\npathlib.Path('imported-from').write_text(__file__)\n")
    broker = Timestone(checkout=checkout)
    broker.prepare()
    assert broker.label == "timestone (older)"  # no git here: the directory names it
    assert broker.config_key != Timestone().config_key  # measured apart from this checkout's broker
    with broker.running() as running:
        assert net.mqtt_handshake(running.port, timeout=2.0)
        imported = (running.workdir / "imported-from").read_text()
    assert imported == str(checkout / "broker_edge" / "__init__.py")


def test_a_directory_that_is_no_checkout_is_refused_before_the_run(tmp_path: Path) -> None:
    with pytest.raises(BrokerUnavailable, match="no checkout"):
        Timestone(checkout=tmp_path).prepare()
