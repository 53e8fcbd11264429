"""Long polls waiting when the API stops (the broker asked to stop) are answered at once, empty, where the
stop waited for each of them to run its whole wait (up to 60 s, past a service manager's stop timeout)."""

from __future__ import annotations

import http.client
import json
import threading
import time

from tests.e2e.offsets_api.api_harness import ApiHarness

WAIT_MS = 30_000


def long_poll(harness: ApiHarness, method: str, target: str, body: bytes | None, answers: list) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", harness.port, timeout=60)
    try:
        started = time.monotonic()
        connection.request(method, target, body)
        response = connection.getresponse()
        answers.append((response.status, dict(response.headers), response.read(), time.monotonic() - started))
    finally:
        connection.close()


def test_stopping_the_api_answers_its_long_polls_at_once(api: ApiHarness):
    fetch = json.dumps(
        {"fetches": [{"topic": "plant/1/temp", "offset": "latest"}], "wait_ms": WAIT_MS, "format": "jsonl"}
    ).encode()
    polls = [
        ("GET", f"/v1/logs/plant%2F1%2Ftemp/records?offset=latest&wait_ms={WAIT_MS}&format=jsonl", None),
        ("POST", "/v1/fetch", fetch),
    ]
    answers: list = []
    threads = [threading.Thread(target=long_poll, args=(api, *poll, answers)) for poll in polls]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # both waiting

    started = time.monotonic()
    api.stop_server()
    stopped_in = time.monotonic() - started
    for thread in threads:
        thread.join(timeout=60)

    assert stopped_in < 5
    assert sorted(answer[0] for answer in answers) == [200, 200]
    assert all(answer[3] < 5 for answer in answers)
    records = next(answer for answer in answers if "Timestone-Record-Count" in answer[1])
    batch = next(answer for answer in answers if answer is not records)
    assert records[1]["Timestone-Record-Count"] == "0" and records[2] == b""
    assert json.loads(batch[2])["results"]["plant/1/temp"]["records"] == 0
