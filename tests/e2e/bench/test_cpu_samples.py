"""A broker run under ``bench.cpu_samples``: its samples are stacks of the broker's own work, taken from
``run_broker`` on, and the report adds them up."""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
from pathlib import Path

from bench import net
from bench.brokers.base import stop_process_group
from bench.cpu_samples import CpuSampler, read_stacks, report
from tests.e2e.broker_clients import PahoClient, wait_for

REPO = Path(__file__).resolve().parents[3]
PUBLISHES = 20_000
PUBLISH_PATH = {
    "Connection.receive (broker_edge/engine/connection/connection.py)",
    "PublishPath._persist (broker_edge/engine/publish.py)",
    "PublishPath._route_and_acknowledge (broker_edge/engine/publish.py)",
}


def test_a_sampled_broker_writes_the_stacks_of_its_work_and_the_report_adds_them_up(tmp_path: Path) -> None:
    port = net.free_port()
    config = tmp_path / "broker.yaml"
    config.write_text(
        f"listeners:\n  - {{name: default, host: 127.0.0.1, port: {port}}}\n"
        f"storage: {{directory: {tmp_path / 'data'}}}\n"
        "offsets_api: {port: 0}\nadmin_http: {port: 0}\nlogging: {level: WARNING}\n"
        "limits: {messages_per_second_per_client: 0}\n"
    )
    samples = tmp_path / "samples"
    command = [sys.executable, "-m", "bench.cpu_samples", str(samples), "broker", "--config", str(config)]
    with open(tmp_path / "broker.log", "wb") as log:
        process = subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        assert wait_for(lambda: net.mqtt_handshake(port), 30), (tmp_path / "broker.log").read_text()
        device = PahoClient(port, "sampled-device", connect=False)
        device.client.max_inflight_messages_set(64)
        device.connect()
        sent = [device.client.publish(f"sampled/{n % 16}", b"x" * 64, 1) for n in range(PUBLISHES)]
        assert wait_for(lambda: all(info.is_published() for info in sent), 60), "every publish acknowledged"
        device.disconnect()
    finally:
        stop_process_group(process, grace=30)
    assert process.returncode == 0, (tmp_path / "broker.log").read_text()

    assert [path.name for path in samples.iterdir()] == [f"cpu-{process.pid}.txt"]  # the one broker process
    stacks = read_stacks(samples)
    assert sum(count for _, count in stacks) > 0
    assert all("run_broker (broker_edge/runtime/main.py)" in frames for frames, _ in stacks)
    assert any(PUBLISH_PATH & set(frames) for frames, _ in stacks), "the publishes' work is sampled"

    text = report(samples, under="run_broker")
    assert "100.0 %  run_broker (broker_edge/runtime/main.py)" in text
    persisted = report(samples, under="PublishPath._persist")
    assert "PublishPath._persist (broker_edge/engine/publish.py)" in persisted
    assert "run_broker" not in persisted  # the stacks are cut at the function asked for


def test_a_sample_outside_the_sampled_function_is_not_counted(tmp_path: Path) -> None:
    """A tick can fall in the sampler's own start or stop, or as the sampled function returns: such a stack
    is not the work sampled (one was seen in ``CpuSampler.stop``)."""

    def work(sampler: CpuSampler) -> None:
        sampler._sample(signal.SIGPROF, inspect.currentframe())

    sampler = CpuSampler(tmp_path, within=work.__code__)
    work(sampler)
    sampler._sample(signal.SIGPROF, inspect.currentframe())  # as if in the sampler's stop
    assert [stack[-1][0] for stack in sampler.counts] == [work.__code__]
    assert sum(sampler.counts.values()) == 1
