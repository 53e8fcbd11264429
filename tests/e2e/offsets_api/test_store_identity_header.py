"""Every answer of the offsets API tells the identity of the broker's store (``Timestone-Store``): the same
across restarts of one data directory, another once the directory is wiped."""

from __future__ import annotations

import shutil
from pathlib import Path

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.offsets_api.formats import STORE_HEADER
from tests.e2e.offsets_api.api_harness import TOKEN, ApiHarness, sample_record
from tests.e2e.offsets_api.test_offsets_api_http import TEMP, request


def test_every_answer_tells_the_store_errors_and_streamed_listings_included(api: ApiHarness) -> None:
    store_id = api.store.store_id
    assert store_id is not None and len(store_id) == 32
    for method, target in [
        ("GET", "/v1/logs"),  # streamed (chunked)
        ("GET", TEMP),
        ("GET", TEMP + "/records?offset=0"),
        ("GET", "/v1/partitions"),
        ("GET", "/v1/logs/nothing%2Fhere"),  # 404
        ("GET", TEMP + "/records?offset=x"),  # 400
    ]:
        _, headers, _ = request(api, method, target)
        assert headers[STORE_HEADER] == store_id, target
    with OffsetsClient(api.base_url) as client:
        client.list_logs()
        assert client.store == store_id
        assert client.fetch_many({"plant/1/temp": 0}).store == store_id
        assert client.read_partition(0, 0).store == store_id


def test_the_store_is_the_same_after_a_restart_and_new_once_wiped(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    harness = ApiHarness(directory, token=TOKEN)
    harness.append("plant/1/temp", sample_record(1))
    first = harness.store.store_id
    with OffsetsClient(harness.base_url, TOKEN) as client:
        client.list_logs()
        assert client.store == first
    harness.close()

    restarted = ApiHarness(directory, token=TOKEN)
    with OffsetsClient(restarted.base_url, TOKEN) as client:
        client.list_logs()
        assert client.store == first
    restarted.close()

    shutil.rmtree(directory)
    wiped = ApiHarness(directory, token=TOKEN)
    with OffsetsClient(wiped.base_url, TOKEN) as client:
        assert client.list_logs() == []
        assert client.store not in (None, first)
    wiped.close()
