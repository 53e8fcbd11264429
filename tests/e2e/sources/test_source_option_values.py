"""Option values a user may write that the ``timestone`` source refuses at ``load()``, naming the option,
rather than failing later (at the query's start or in a task) with an error that names none."""

from __future__ import annotations

import re

import pytest
from pyspark.sql import SparkSession

from tests.e2e.sources.conftest import EdgeBroker

pytestmark = pytest.mark.spark


def load(spark: SparkSession, **options: str) -> None:
    reader = spark.readStream.format("timestone")
    for name, value in {"topics": "plant/+/temp", **options}.items():
        reader = reader.option(name, value)
    reader.load()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("time:1969-12-31T23:59:59Z", "before 1970-01-01T00:00:00Z"),
        ("0001-01-01", "before 1970-01-01T00:00:00Z"),
        ("time:\uff11\uff12\uff13", "expected epoch milliseconds or an ISO-8601 timestamp"),
        ("time:\u00b2", "expected epoch milliseconds or an ISO-8601 timestamp"),
    ],
)
def test_a_start_time_no_log_can_hold_is_refused_naming_the_option(
    timestone_spark: SparkSession, edge: EdgeBroker, value: str, message: str
) -> None:
    """A time before the Unix epoch reached the broker as a negative number (a 400 naming no option); digits
    that are not ASCII were read as a time, or ended in int()'s ValueError."""
    with pytest.raises(Exception, match=f"timestone source option 'startingOffsets'.*{message}"):
        load(timestone_spark, brokers=f"e1={edge.url}", startingOffsets=value)


@pytest.mark.parametrize("option", ["fetchTimeoutMs", "retryBackoffMs"])
def test_a_wait_longer_than_a_socket_or_a_sleep_takes_is_refused_naming_the_option(
    timestone_spark: SparkSession, edge: EdgeBroker, option: str
) -> None:
    """Long.MaxValue written for "wait for ever" ended the query's start (or a task's retry) in
    OverflowError: timestamp out of range for platform time_t."""
    with pytest.raises(
        Exception, match=f"timestone source option '{option}': expected an integer <= 2147483647"
    ):
        load(timestone_spark, brokers=f"e1={edge.url}", **{option: "9223372036854775807"})


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("brokers", "e1=http://127.0.0.1:99999"),
        ("brokers", "http://127.0.0.1:0"),
        ("brokers", "e1=http://127.0.0.1:1x"),
        ("bootstrapServers", "http://127.0.0.1:65536"),
    ],
)
def test_a_url_whose_port_no_socket_has_is_refused_naming_the_option(
    timestone_spark: SparkSession, option: str, value: str
) -> None:
    """Such a URL was taken, and the query's start ended in urllib's ValueError: Port out of range."""
    with pytest.raises(Exception, match=f"timestone source option '{option}'.*{value}"):
        load(timestone_spark, **{option: value})


@pytest.mark.parametrize(
    ("option", "token"),
    [("authToken", "secret\nX-Injected: 1"), ("authToken", "jeton-\u20ac"), ("authToken.e1", "se\tcret")],
)
def test_a_token_no_http_header_can_carry_is_refused_without_showing_it(
    timestone_spark: SparkSession, edge: EdgeBroker, option: str, token: str
) -> None:
    """Such a token was taken, and the query's start ended in http.client's ValueError quoting the
    Authorization header, secret included, or in a UnicodeEncodeError."""
    with pytest.raises(Exception, match=f"timestone source option '{option}': ") as refused:
        load(timestone_spark, brokers=f"e1={edge.url}", **{option: token})
    assert "secret" not in str(refused.value) and "jeton" not in str(refused.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"startingOffsets": '{"e1": {"plant/1/temp": 2, "plant/2/tmp": 3}}'}, "'plant/2/tmp'"),
        ({"startingOffsets": '{"e1": {"$SYS/broker/uptime": 0}}', "topics": "#"}, "'$SYS/broker/uptime'"),
        ({"startingOffsets": '{"e1": {"plant/1/temp": 0}}', "sites": "true"}, "'plant/1/temp'"),
    ],
    ids=["misspelt", "dollar", "site-without-prefix"],
)
def test_a_json_start_naming_a_topic_no_filter_reads_is_refused(
    timestone_spark: SparkSession, edge: EdgeBroker, options: dict[str, str], named: str
) -> None:
    """Such a topic was kept in the checkpoint for ever, never read, and the topic meant (misspelt, or on
    a hub without its $site/<site_id>/ prefix) silently started at its log start instead."""
    with pytest.raises(Exception, match=f"timestone source option 'startingOffsets'.*{re.escape(named)}"):
        load(timestone_spark, brokers=f"e1={edge.url}", **options)


@pytest.mark.parametrize(
    ("start", "repeated"),
    [
        ('{"e1": {"plant/1/temp": 5}, "e1": {"plant/2/temp": 3}}', "'e1'"),
        ('{"e1": {"plant/1/temp": 5, "plant/1/temp": 7}}', "'plant/1/temp'"),
    ],
)
def test_a_json_start_naming_a_broker_or_topic_twice_is_refused(
    timestone_spark: SparkSession, edge: EdgeBroker, start: str, repeated: str
) -> None:
    """JSON's last value won silently: the first broker's topics started at their log start instead."""
    with pytest.raises(
        Exception, match=f"timestone source option 'startingOffsets'.*{re.escape(repeated)} twice"
    ):
        load(timestone_spark, brokers=f"e1={edge.url}", startingOffsets=start)


def test_a_read_limit_past_what_spark_counts_is_refused_naming_the_option(
    timestone_spark: SparkSession, edge: EdgeBroker
) -> None:
    """maxRecordsPerTrigger travels to Spark's JVM as the query's read limit, a Long: 2**63 came back
    from it as no number of records, and the query read nothing, without a word."""
    with pytest.raises(
        Exception,
        match="timestone source option 'maxRecordsPerTrigger': expected an integer <= 9223372036854775807",
    ):
        load(timestone_spark, brokers=f"e1={edge.url}", maxRecordsPerTrigger=str(2**63))
