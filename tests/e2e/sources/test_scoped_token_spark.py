"""The timestone source with a reader token limited to topic filters, under Spark, with default options.

A partition holds every topic's records, so a broker reads by partition only for a token of every topic:
one limited to ``plant/#`` is read by topic whatever ``readBy`` says (docs/spark-source.md), and reads
exactly what its filters match. A token the broker does not know fails the query naming the option.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.sources.conftest import plain

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

TOKEN = "plant-reader-s3cret"
TOKENS = {"tokens": [{"name": "plant-reader", "token": TOKEN, "topics": ["plant/#"]}]}


def publish(broker: RunningBroker, ends: dict[str, int]) -> None:
    """Records ``"<topic> <offset>"`` appended to each topic up to the end given."""
    store = broker.broker.store
    assert store is not None

    def send() -> None:
        for topic, end in ends.items():
            for number in range(store.durable_end(topic) if topic in store else 0, end):
                broker.broker.publish(topic, f"{topic} {number}".encode(), qos=1)

    broker.call(send)
    assert wait_for(lambda: broker.call(lambda: all(store.durable_end(t) == n for t, n in ends.items())))


def read_available_now(
    spark: SparkSession, broker: RunningBroker | str, checkpoint: Path, **options: str
) -> list:
    """Every row a query with default options (but ``options``) reads of ``broker`` (or the broker at that
    URL), run to the end of what is there."""
    url = broker if isinstance(broker, str) else f"http://127.0.0.1:{broker.broker.offsets_port}"
    rows: list = []

    def sink(frame: DataFrame, _batch_id: int) -> None:
        rows.extend(frame.select("topic", "offset", "payload").collect())

    source = (
        spark.readStream.format("timestone")
        .option("brokers", f"edge={url}")
        .option("topics", "#")
        .options(**options)
        .load()
    )
    query = source.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    running = query.trigger(availableNow=True).start()
    try:
        running.awaitTermination(120)
    finally:
        running.stop()
    error = running.exception()
    if error is not None:
        raise error
    return rows


def test_a_token_limited_to_topic_filters_reads_by_topic_with_the_default_options(
    brokers: Callable[..., RunningBroker], timestone_spark: SparkSession, tmp_path: Path
) -> None:
    broker = brokers("edge", offsets_api=TOKENS)
    publish(broker, {"plant/1/temp": 3, "plant/2/temp": 2, "secrets/key": 4})
    checkpoint = tmp_path / "checkpoint"

    # the defaults: startingOffsets latest, readBy partitions (which this token cannot read)
    assert read_available_now(timestone_spark, broker, checkpoint, authToken=TOKEN) == []
    offsets = sorted(
        (p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    last = json.loads(offsets[-1].read_text().splitlines()[-1])
    assert plain(last) == {"edge": {"plant/1/temp": 3, "plant/2/temp": 2}}  # by topic, and only its topics

    publish(broker, {"plant/1/temp": 5, "plant/3/temp": 1, "secrets/key": 6})
    rows = read_available_now(timestone_spark, broker, checkpoint, authToken=TOKEN)
    assert sorted((row.topic, row.offset, bytes(row.payload)) for row in rows) == [
        ("plant/1/temp", 3, b"plant/1/temp 3"),
        ("plant/1/temp", 4, b"plant/1/temp 4"),
        ("plant/3/temp", 0, b"plant/3/temp 0"),
    ]


def test_a_token_the_broker_does_not_know_fails_the_query_naming_the_option(
    brokers: Callable[..., RunningBroker], timestone_spark: SparkSession, tmp_path: Path
) -> None:
    broker = brokers("edge", offsets_api=TOKENS)
    publish(broker, {"plant/1/temp": 1})
    with pytest.raises(StreamingQueryException, match=r"refused the token.*authToken"):
        read_available_now(timestone_spark, broker, tmp_path / "checkpoint", authToken="wrong")
