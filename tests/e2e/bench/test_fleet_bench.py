"""The fleet benchmark's load: every device on its own topic, each a connection with its own window, and
the peers it runs against with their persistence on (Aedes' LevelDB store)."""

from __future__ import annotations

from bench.brokers import Aedes
from bench.loadgen.flow import Timing, run_flow
from bench.scenarios import fleet
from bench.sysinfo import dir_bytes

SHORT = Timing(warmup_s=0.3, measure_s=0.7, drain_s=4.0, connect_timeout_s=20.0)


def test_each_device_publishes_on_its_own_topic_and_every_acknowledged_message_is_delivered() -> None:
    spec = fleet.spec(40)
    assert len(set(spec.topics)) == 40 and spec.window == fleet.WINDOW < spec.blob_frames
    aedes = Aedes(persistence=True)
    aedes.prepare()
    with aedes.running() as broker:
        result = run_flow(broker, spec, SHORT, cpus=None)
        on_disk = dir_bytes(broker.data_dir)
    assert result.acked == result.sent > 40  # every device published more than once
    assert result.delivered == result.expected == result.acked
    assert on_disk > 0  # the LevelDB store exists: Aedes ran with its persistence on
