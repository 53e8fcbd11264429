"""Options of the timestone source: what users type, what it means, and errors that name the option."""

from __future__ import annotations

import pytest

from broker_edge.config.endpoints import BrokerEndpoint
from sources.options import (
    DEFAULT_MAX_RECORDS_PER_PARTITION,
    SourceOptionError,
    StartKind,
    parse_options,
)

BASE = {"brokers": "http://127.0.0.1:8081", "topics": "plant/+/telemetry"}


def parse(**extra: str):
    return parse_options({**BASE, **extra})


def test_defaults_mirror_the_kafka_source() -> None:
    options = parse()
    assert options.brokers == (BrokerEndpoint("http://127.0.0.1:8081", "http://127.0.0.1:8081"),)
    assert options.topics == ("plant/+/telemetry",)
    assert options.starting_offsets.kind is StartKind.LATEST
    assert options.fail_on_data_loss is True
    assert options.max_records_per_trigger is None
    assert options.max_records_per_partition == DEFAULT_MAX_RECORDS_PER_PARTITION
    assert options.min_partitions is None  # the source decides (Spark's defaultParallelism)


def test_read_by_partitions_unless_told_topics() -> None:
    assert parse().read_by == "partitions"
    assert parse(readBy="Topics").read_by == "topics"
    with pytest.raises(SourceOptionError, match="'readBy': expected one of partitions, topics"):
        parse(readBy="offsets")


def test_min_partitions_is_a_positive_integer() -> None:
    assert parse(minPartitions="4").min_partitions == 4
    assert parse(MINPARTITIONS="1").min_partitions == 1


def test_option_names_are_case_insensitive_like_spark_passes_them() -> None:
    options = parse_options(
        {"BROKERS": BASE["brokers"], "topics": "a/#", "maxrecordspertrigger": "10", "FailOnDataLoss": "FALSE"}
    )
    assert options.max_records_per_trigger == 10
    assert options.fail_on_data_loss is False


def test_named_brokers_tokens_per_broker_and_a_default_token() -> None:
    options = parse(
        brokers="edge1=http://10.0.0.1:8081/, http://10.0.0.2:8081",
        authToken="shared",
        **{"authtoken.edge1": "secret-1"},
    )
    assert options.brokers == (
        BrokerEndpoint("edge1", "http://10.0.0.1:8081", "secret-1"),
        BrokerEndpoint("http://10.0.0.2:8081", "http://10.0.0.2:8081", "shared"),
    )
    assert "secret" not in repr(options.brokers)


@pytest.mark.parametrize(
    ("extra", "option", "fragment"),
    [
        ({"brokers": ""}, "brokers", "required"),
        ({"brokers": "10.0.0.1:8081"}, "brokers", "http(s) base URL"),
        ({"brokers": "a=http://h:1,a=http://h:2"}, "brokers", "repeated: a"),
        ({"topics": "plant/#/x"}, "topics", "misplaced wildcard"),
        ({"topics": "$share/g/a"}, "topics", "shared"),
        ({"maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger", ">= 1"),
        ({"maxRecordsPerPartition": "many"}, "maxRecordsPerPartition", "'many'"),
        ({"minPartitions": "0"}, "minPartitions", ">= 1"),
        ({"maxTopicsPerPartition": "10001"}, "maxTopicsPerPartition", "<= 10000"),
        ({"failOnDataLoss": "yes"}, "failOnDataLoss", "true or false"),
        ({"fetchRetries": "-1"}, "fetchRetries", ">= 0"),
        ({"maxBytesPerFetch": str(128 << 20)}, "maxBytesPerFetch", "<= 67108864"),
        ({"startingOffsets": "beginning"}, "startingOffsets", "earliest, latest"),
        ({"startingOffsets": "time:yesterday"}, "startingOffsets", "'yesterday'"),
        ({"startingOffsets": "time:99999999999999999999"}, "startingOffsets", "past any time a log holds"),
        ({"startingOffsets": "2026-13-01"}, "startingOffsets", "an ISO-8601 timestamp, got '2026-13-01'"),
        (
            {"startingOffsets": '{"http://127.0.0.1:8081": {"#p0": 1}}'},
            "startingOffsets",
            "'#p0' is not a topic",
        ),
        ({"startingOffsets": '{"other": {"a": 1}}'}, "startingOffsets", "'other' is not one of"),
        ({"startingOffsets": '{"http://127.0.0.1:8081": {"a": -3}}'}, "startingOffsets", ">= -2"),
        ({"startingOffset": "earliest"}, "startingoffset", "unknown option"),
        ({"authToken.edge9": "x"}, "authToken.edge9", "names no broker"),
    ],
)
def test_errors_name_the_option(extra: dict[str, str], option: str, fragment: str) -> None:
    with pytest.raises(SourceOptionError) as caught:
        parse(**extra)
    assert caught.value.option == option
    assert f"option '{option}'" in str(caught.value)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("text", "epoch_ms"),
    [
        ("time:1767225600000", 1767225600000),
        ("time:2026-01-01T00:00:00Z", 1767225600000),
        ("2026-01-01T01:00:00+01:00", 1767225600000),
        ("2026-01-01T00:00:00", 1767225600000),
    ],
)
def test_starting_offsets_by_time(text: str, epoch_ms: int) -> None:
    start = parse(startingOffsets=text).starting_offsets
    assert start.kind is StartKind.TIMESTAMP
    assert start.timestamp_ms == epoch_ms


def test_starting_offsets_json_keeps_earliest_and_latest_markers() -> None:
    start = parse(topics="a,b,c", startingOffsets='{"http://127.0.0.1:8081": {"a": 5, "b": -2, "c": -1}}')
    start = start.starting_offsets
    assert start.kind is StartKind.SPECIFIC
    assert start.specific == {"http://127.0.0.1:8081": {"a": 5, "b": -2, "c": -1}}


CLUSTER = {"bootstrapServers": "http://b1:9884, http://b2:9884/", "topics": "plant/+/telemetry"}


def test_a_cluster_is_read_from_bootstrap_members_under_one_name_with_one_token() -> None:
    options = parse_options({**CLUSTER, "authToken": "secret"})
    assert options.reads_cluster and options.brokers == ()
    assert options.bootstrap_servers == ("http://b1:9884", "http://b2:9884")
    assert options.cluster_name == "cluster" and options.auth_token == "secret"
    assert "secret" not in repr(options)
    assert parse_options({**CLUSTER, "clusterName": "plant-a"}).cluster_name == "plant-a"
    assert not parse().reads_cluster


def test_a_clusters_json_start_is_keyed_by_topic() -> None:
    start = parse_options(
        {**CLUSTER, "topics": "a/+,c", "clusterName": "p", "startingOffsets": '{"a/b": 5, "c": -2}'}
    )
    assert start.starting_offsets.kind is StartKind.SPECIFIC
    assert start.starting_offsets.specific == {"p": {"a/b": 5, "c": -2}}


def test_sites_are_listed_under_every_site_from_a_hub_alone_or_a_cluster_hub() -> None:
    hub = parse_options({**CLUSTER, "topics": "plant/+/telemetry,alarms", "sites": "true"})
    assert hub.reads_cluster and hub.sites
    assert hub.log_patterns == ("$site/+/plant/+/telemetry", "$site/+/alarms")
    assert parse_options({**CLUSTER, "topics": "alarms"}).log_patterns == ("alarms",)
    assert parse(sites="true").log_patterns == ("$site/+/plant/+/telemetry",)


@pytest.mark.parametrize(
    ("extra", "option", "fragment"),
    [
        ({"brokers": "http://h:1"}, "bootstrapServers", "not both"),
        ({"bootstrapServers": "b1:9884"}, "bootstrapServers", "offsets API base URLs"),
        ({"bootstrapServers": "http://b1:9884,,"}, "bootstrapServers", "''"),
        ({"authToken.b1": "x"}, "authToken.b1", "use authToken"),
        ({"clusterName": "a b"}, "clusterName", "letters, digits"),
        ({"startingOffsets": '{"cluster": {"a": 1}}'}, "startingOffsets", '{"topic": offset}'),
        ({"startingOffsets": '{"a": -5}'}, "startingOffsets", ">= -2"),
        ({"startingOffsets": "first"}, "startingOffsets", '{"topic": offset}'),
    ],
)
def test_cluster_option_errors_name_the_option(extra: dict[str, str], option: str, fragment: str) -> None:
    with pytest.raises(SourceOptionError) as caught:
        parse_options({**CLUSTER, **extra})
    assert caught.value.option == option
    assert fragment in str(caught.value)


def test_brokers_or_bootstrap_servers_is_required_and_cluster_name_needs_a_cluster() -> None:
    with pytest.raises(SourceOptionError, match="or bootstrapServers"):
        parse_options({"topics": "a"})
    with pytest.raises(SourceOptionError) as caught:
        parse(clusterName="plant")
    assert caught.value.option == "clusterName"
