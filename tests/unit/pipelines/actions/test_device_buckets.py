"""The device bucket function is part of the device protocol: the job and every device compute it alike."""

from __future__ import annotations

import json

from broker_edge.protocol.topics import topic_matches
from pipelines.actions.buckets import REPORT_TOPICS, bucket_of, bucket_topic, by_bucket, report_topic
from pipelines.actions.config import ActionsConfig
from pipelines.actions.model import Action


def test_a_bucket_is_the_crc32_of_the_ids_utf8_bytes_modulo_the_bucket_count() -> None:
    # CRC-32 (IEEE, as zlib and java.util.zip.CRC32) of b"dev-00017" is 1082564138
    assert bucket_of("dev-00017", 1024) == 1082564138 % 1024 == 554
    assert bucket_of("dev-00000", 1024) == 712
    assert bucket_of("dev-00017", 1) == 0
    assert bucket_topic(554) == "actions/buckets/554"


def test_ids_grouped_by_bucket_keep_their_order_and_each_id_once() -> None:
    ids = [f"dev-{n:05d}" for n in range(1_000)]
    groups = by_bucket(ids, 64)
    assert sorted(d for group in groups.values() for d in group) == ids
    for bucket, group in groups.items():
        assert group == [d for d in ids if bucket_of(d, 64) == bucket]


def test_a_bucket_message_lists_its_ids_and_the_unlisted_message_has_no_list() -> None:
    action = Action(id="a-1", kind="command", payload={"command": "reboot"})
    listed = json.loads(action.message(1_000, ["dev-00001", "dev-00002"]))
    assert listed["device_ids"] == ["dev-00001", "dev-00002"] and listed["command"] == "reboot"
    assert "device_ids" not in json.loads(action.message(1_000))
    assert json.loads(action.cancel_message(1_000, ["dev-00001"]))["device_ids"] == ["dev-00001"]


def test_a_device_reports_on_its_buckets_report_topic_which_the_job_reads_with_the_earlier_one() -> None:
    assert report_topic(bucket_of("dev-00017", 1024)) == "actions/reports/554"
    assert topic_matches(REPORT_TOPICS, report_topic(554))
    assert not topic_matches(REPORT_TOPICS, bucket_topic(554))
    assert ActionsConfig().status_topics.split(",") == [REPORT_TOPICS, "devices/+/actions"]


def test_sites_reports_are_read_from_a_hub_alone_or_a_cluster_hub() -> None:
    from pipelines.actions.job import validate

    assert validate({"sites": True}).sites is True
    on_cluster = validate({"sites": True, "cluster": True})
    assert on_cluster.sites is True and on_cluster.cluster is True
