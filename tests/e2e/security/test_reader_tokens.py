"""Readers' tokens on a real broker: several, each limited to its topic filters, and rotated on SIGHUP
(the tokens file and the offsets API's certificate) with the old and the new accepted in between."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from broker_edge.offsets_api.client import AuthError, BadRequestError, ForbiddenError, OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient
from tests.tls_certs import make_test_pki

TOKENS = [
    {"name": "notebook", "token": "nb-5d1c", "topics": ["plant-a/#"]},
    {"name": "plant-b-job", "token": "pb-77e0", "topics": ["plant-b/+/telemetry"]},
    {"name": "ops", "token": "ops-9a4f"},  # every topic
]


def http_get(url: str, token: str, context: ssl.SSLContext | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_token_lists_and_reads_only_the_topics_its_filters_match(brokers):
    running = brokers(offsets_api={"host": "127.0.0.1", "tokens": TOKENS})
    device = PahoClient(running.port, "m1")
    for topic in ("plant-a/m1/telemetry", "plant-b/m1/telemetry", "plant-b/m1/config"):
        device.publish(topic, b"x", 1)
    base = f"http://127.0.0.1:{running.broker.offsets_port}"

    listed = {
        name: sorted(log["topic"] for log in http_get(f"{base}/v1/logs", token)[1]["logs"])
        for name, token in (("notebook", "nb-5d1c"), ("plant-b-job", "pb-77e0"), ("ops", "ops-9a4f"))
    }
    assert listed == {
        "notebook": ["plant-a/m1/telemetry"],
        "plant-b-job": ["plant-b/m1/telemetry"],
        "ops": ["plant-a/m1/telemetry", "plant-b/m1/config", "plant-b/m1/telemetry"],
    }
    for path in ("", "/records?offset=0&format=jsonl", "/offset?timestamp_ms=0"):
        status, body = http_get(f"{base}/v1/logs/plant-b%2Fm1%2Ftelemetry{path}", "nb-5d1c")
        assert (status, body["error"]) == (403, "forbidden")
        assert "notebook may not read 'plant-b/m1/telemetry'" in body["message"]
    # the same answer whether the topic exists or not: a token learns nothing of other topics
    assert http_get(f"{base}/v1/logs/plant-b%2Fnone", "nb-5d1c")[0] == 403
    with OffsetsClient(base, token="nb-5d1c") as notebook:
        assert notebook.fetch_records("plant-a/m1/telemetry", 0).data[0].payload == b"x"
        with pytest.raises(ForbiddenError) as refused:
            notebook.fetch_records("plant-b/m1/telemetry", 0)
        assert refused.value.topic == "plant-b/m1/telemetry"
        batch = notebook.fetch_many({"plant-a/m1/telemetry": 0, "plant-b/m1/telemetry": 0})
        refusal = batch.results["plant-b/m1/telemetry"].error
        assert isinstance(refusal, ForbiddenError) and batch.table.num_rows == 1
        assert batch.results["plant-a/m1/telemetry"].next_offset == 1
        with pytest.raises(ForbiddenError):  # a partition holds every topic's records
            notebook.read_partition(0, 0)
    assert http_get(f"{base}/v1/partitions", "nb-5d1c")[0] == 403
    assert http_get(f"{base}/v1/partitions", "ops-9a4f")[1]["partitions"][0]["end_position"] == 3
    with OffsetsClient(base, token="not-a-token") as stranger, pytest.raises(AuthError):
        stranger.list_logs()


def _write_tokens(path: Path, tokens: list[dict]) -> None:
    path.write_text(yaml.safe_dump({"tokens": tokens}))
    path.chmod(0o600)


def _reload(broker: BrokerProcess, log_line: str) -> None:
    start = broker.log_path.stat().st_size
    assert broker.process is not None
    os.kill(broker.process.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while log_line not in broker.log_path.read_bytes()[start:].decode(errors="replace"):
        assert time.monotonic() < deadline, f"no {log_line!r} in the broker's log"
        time.sleep(0.05)


def test_tokens_and_the_certificate_rotate_on_sighup_with_old_and_new_accepted_in_between(tmp_path):
    old_pki, new_pki = make_test_pki(tmp_path / "old"), make_test_pki(tmp_path / "new")
    live = tmp_path / "live"
    live.mkdir()
    for name in ("server_cert", "server_key"):
        shutil.copy(getattr(old_pki, name), live / name)
    # the CA bundle readers trust holds both CAs during the switch
    trust_both = tmp_path / "both-cas.pem"
    trust_both.write_bytes(old_pki.ca_cert.read_bytes() + new_pki.ca_cert.read_bytes())
    tokens_file = tmp_path / "tokens.yaml"
    _write_tokens(tokens_file, [{"name": "job", "token": "old-1f2e"}])
    tls = {"certfile": str(live / "server_cert"), "keyfile": str(live / "server_key")}
    broker = BrokerProcess(tmp_path / "broker", offsets_api={"tokens_file": str(tokens_file), "tls": tls})
    with broker:
        base = f"https://127.0.0.1:{broker.offsets_port}/v1/logs"
        old_ca = ssl.create_default_context(cafile=str(old_pki.ca_cert))
        new_ca = ssl.create_default_context(cafile=str(new_pki.ca_cert))
        assert http_get(base, "old-1f2e", old_ca)[0] == 200

        _write_tokens(
            tokens_file, [{"name": "job", "token": "old-1f2e"}, {"name": "job-2", "token": "new-3c4d"}]
        )
        for name in ("server_cert", "server_key"):
            shutil.copy(getattr(new_pki, name), live / name)
        _reload(broker, "readers' tokens reloaded")
        assert http_get(base, "old-1f2e", new_ca)[0] == 200  # both tokens, the new certificate
        assert http_get(base, "new-3c4d", new_ca)[0] == 200
        with pytest.raises(urllib.error.URLError):
            http_get(base, "new-3c4d", old_ca)  # the old certificate is gone

        _write_tokens(tokens_file, [{"name": "job-2", "token": "new-3c4d"}])
        _reload(broker, "readers' tokens reloaded")
        assert http_get(base, "old-1f2e", new_ca)[0] == 401
        assert http_get(base, "new-3c4d", new_ca)[0] == 200

        tokens_file.write_text("tokens: [{name: job-3")  # a bad edit keeps the tokens in force
        _reload(broker, "readers' tokens not reloaded, the previous ones stay in force")
        assert http_get(base, "new-3c4d", new_ca)[0] == 200
        plain_url = base.rsplit("/v1", 1)[0].replace("https://", "http://")
        plain = OffsetsClient(plain_url, token="new-3c4d", retries=0)
        with plain, pytest.raises(BadRequestError, match="speaks TLS"):  # not https: told so, nothing served
            plain.list_logs()
