"""The telemetry config: the shipped file loads, and mistakes are reported by their dotted path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from broker_edge.config.loader import ConfigError
from pipelines.payloads.protobuf import EXAMPLE_MESSAGE, example_descriptor_set
from pipelines.telemetry.config import TopicTemplate, load_telemetry_config, load_telemetry_config_file

REPO = Path(__file__).resolve().parents[4]


def test_shipped_config_loads_and_derives_source_options():
    config = load_telemetry_config_file(REPO / "conf" / "pipeline.yaml")
    assert config.payload.template.topic_filter == "devices/+/telemetry"
    assert config.source_options() == {
        "brokers": "edge1=http://127.0.0.1:9884",
        "topics": "devices/+/telemetry",
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
        "maxRecordsPerTrigger": "250000",
    }
    assert "ts" not in config.payload.silver_fields and "seq" in config.payload.silver_fields
    assert [s.name for s in config.quality.suites] == ["telemetry_basic"]


def test_empty_section_means_defaults():
    assert load_telemetry_config(None).stream.trigger_interval == "1 second"


@pytest.mark.parametrize(
    ("section", "path"),
    [
        ({"source": {"brokerz": []}}, "telemetry.source.brokerz"),
        ({"payload": {"fields": {"t": "decimal(3"}}}, "telemetry.payload.fields.t"),
        ({"payload": {"topic_template": "devices/+/telemetry"}}, "telemetry.payload.topic_template"),
        ({"payload": {"event_time_field": "time"}}, "telemetry.payload.event_time_field"),
        ({"dedup": {"message_id_fields": ["seq", "msg"]}}, "telemetry.dedup.message_id_fields[1]"),
        ({"dedup": {"message_id_fields": ["ts"]}}, "telemetry.dedup.message_id_fields[0]"),
        ({"gold": {"minute_metrics": ["firmware"]}}, "telemetry.gold.minute_metrics[0]"),
        ({"quality": {"gx": {"engine": "dask"}}}, "telemetry.quality.gx.engine"),
        (
            {
                "quality": {
                    "suites": [
                        {
                            "name": "s",
                            "expectations": [
                                {"type": "expect_column_values_to_not_be_null", "column": "temp"}
                            ],
                        }
                    ]
                }
            },
            "telemetry.quality.suites[0].expectations[0].column",
        ),
        (
            {
                "quality": {
                    "suites": [
                        {
                            "name": "s",
                            "expectations": [
                                {"type": "expect_column_values_to_be_between", "column": "humidity"}
                            ],
                        }
                    ]
                }
            },
            "telemetry.quality.suites[0].expectations[0].min_value",
        ),
        (
            {
                "quality": {
                    "suites": [
                        {
                            "name": "s",
                            "expectations": [
                                {"type": "expect_column_values_to_be_in_set", "column": "group"}
                            ],
                        }
                    ]
                }
            },
            "telemetry.quality.suites[0].expectations[0].value_set",
        ),
        (
            {"tables": {"maintenance": {"compact_interval_s": 0}}},
            "telemetry.tables.maintenance.compact_interval_s",
        ),
        ({"tables": {"maintenance": {"min_files": 1}}}, "telemetry.tables.maintenance.min_files"),
        ({"tables": {"maintenance": {"settle_s": -1}}}, "telemetry.tables.maintenance.settle_s"),
        (
            {"payload": {"formats": [{"topic_template": "cbor/{site}", "format": "cbor"}]}},
            "telemetry.payload.formats[0].topic_template",
        ),
        (
            {"payload": {"formats": [{"topic_template": "spBv1.0/#", "format": "sparkplug_b"}]}},
            "telemetry.payload.formats[0].topic_template",
        ),
        (
            {"payload": {"formats": [{"topic_template": "d/{device_id}", "format": "protobuf"}]}},
            "telemetry.payload.formats[0].protobuf",
        ),
        (  # a template in a Sparkplug B group the sparkplug_b entry reads: its payloads read twice
            {
                "payload": {
                    "topic_template": "spBv1.0/{site}/NDATA/{device_id}",
                    "formats": [{"topic_template": "spBv1.0/{group_id}", "format": "sparkplug_b"}],
                }
            },
            "telemetry.payload.topic_template",
        ),
        (
            {
                "payload": {
                    "formats": [
                        {"topic_template": "spBv1.0/plant1", "format": "sparkplug_b"},
                        {"topic_template": "spBv1.0/plant1/DDATA/gw/{device_id}", "format": "cbor"},
                    ]
                }
            },
            "telemetry.payload.formats[1].topic_template",
        ),
        (
            {
                "payload": {
                    "formats": [
                        {"topic_template": "d/{device_id}", "format": "cbor"},
                        {
                            "topic_template": "p/{device_id}",
                            "format": "protobuf",
                            "protobuf": {"descriptor_set": "missing.desc", "message": "a.Reading"},
                        },
                    ]
                }
            },
            "telemetry.payload.formats[1].protobuf.descriptor_set",
        ),
        (
            {"tables": {"maintenance": {"retention_hours": 0.01}}},
            "telemetry.tables.maintenance.retention_hours",
        ),
    ],
)
def test_errors_name_the_field(section, path):
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config(section)
    assert raised.value.path == path, str(raised.value)


def test_topic_template_filter_and_regex():
    template = TopicTemplate("sites/{site}/devices/{device_id}/tele.metry")
    assert template.topic_filter == "sites/+/devices/+/tele.metry"
    assert template.placeholders == ["site", "device_id"]
    assert template.regex == r"^sites/([^/]*)/devices/([^/]*)/tele\.metry$"  # + matches an empty level
    for bad in ("devices/{id}/telemetry", "devices/x{device_id}/t", "devices/#", "a/{device_id}/{device_id}"):
        with pytest.raises(ValueError):
            TopicTemplate(bad)


def test_status_template_adds_its_filter_to_the_source():
    config = load_telemetry_config(
        {"gold": {"devices": {"status_topic_template": "devices/{device_id}/actions"}}}
    )
    assert config.topic_filters == ["devices/+/telemetry", "devices/+/actions"]
    explicit = load_telemetry_config({"source": {"topics": ["devices/#"]}})
    assert explicit.source_options()["topics"] == "devices/#"


def test_payload_formats_give_each_template_its_format_and_add_their_topics(tmp_path):
    descriptor = tmp_path / "telemetry.desc"
    descriptor.write_bytes(example_descriptor_set())
    config = load_telemetry_config(
        yaml.safe_load(
            f"""
            payload:
              formats:
                - {{topic_template: "devices/{{device_id}}/telemetry", format: cbor}}
                - topic_template: "pb/{{device_id}}"
                  format: protobuf
                  protobuf: {{descriptor_set: {descriptor}, message: {EXAMPLE_MESSAGE}}}
                - {{topic_template: "spBv1.0/plant1", format: sparkplug_b}}
            """
        )
    )
    assert [(t.template, f.name) for t, f in config.payload.templates] == [
        ("devices/{device_id}/telemetry", "cbor"),  # the default template, now CBOR
        ("pb/{device_id}", "protobuf"),
    ]
    assert config.payload.sparkplug_filters == ["spBv1.0/plant1/#"]
    assert config.topic_filters == ["devices/+/telemetry", "pb/+", "spBv1.0/plant1/#"]
    assert config.source_options(config.payload.sparkplug_filters)["topics"] == "spBv1.0/plant1/#"


def test_a_protobuf_message_lacking_a_declared_field_is_refused_by_name(tmp_path):
    descriptor = tmp_path / "telemetry.desc"
    descriptor.write_bytes(example_descriptor_set())
    entry = {
        "topic_template": "pb/{device_id}",
        "format": "protobuf",
        "protobuf": {"descriptor_set": str(descriptor), "message": EXAMPLE_MESSAGE},
    }
    section = {"payload": {"formats": [entry], "fields": {"ts": "bigint", "pressure": "double"}}}
    section["gold"] = {
        "minute_metrics": ["pressure"],
        "devices": {"firmware_field": None, "group_field": None},
    }
    section["dedup"] = {"message_id_fields": []}
    section["quality"] = {"suites": []}
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config(section)
    assert raised.value.path == "telemetry.payload.formats[0].protobuf.message"
    assert "has no field 'pressure'" in str(raised.value)


def test_bootstrap_servers_read_a_cluster_instead_of_the_brokers():
    config = load_telemetry_config({"source": {"bootstrap_servers": ["http://b1:9884", "http://b2:9884"]}})
    options = config.source_options()
    assert options["bootstrapServers"] == "http://b1:9884,http://b2:9884"
    assert "brokers" not in options
    with pytest.raises(ConfigError, match=r"bootstrap_servers\[0\]"):
        load_telemetry_config({"source": {"bootstrap_servers": ["b1:9884"]}})


def test_a_template_given_twice_names_the_first_by_its_whole_key():
    """As docs/payload-formats.md shows it: the first entry was said as formats[0], a key of no file."""
    entry = {"topic_template": "d/{device_id}", "format": "cbor"}
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config({"payload": {"formats": [entry, {**entry, "format": "json"}]}})
    assert raised.value.path == "telemetry.payload.formats[1].topic_template"
    assert raised.value.detail == "already given at telemetry.payload.formats[0]"


def test_the_payload_formats_docs_configuration_loads_from_the_repository(monkeypatch):
    """docs/payload-formats.md's example named ``conf/telemetry.desc``, a file nobody has, and fields lacking
    the default minute metrics: it stopped the job (``descriptor_set: cannot read it``, ``'humidity' is not
    a numeric payload field``). It names the simulated fleet's compiled schema and readings."""
    root = Path(__file__).resolve().parents[4]
    block = (root / "docs" / "payload-formats.md").read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(root)  # a descriptor set is read relative to the job's working directory
    config = load_telemetry_config(yaml.safe_load(block)["telemetry"])
    assert config.payload.readers["pb/{device_id}/telemetry"].message == "timestone.example.Telemetry"


def suite_of(*expectations: dict) -> dict:
    """A telemetry section whose one quality suite holds ``expectations``."""
    return {"quality": {"suites": [{"name": "s", "expectations": list(expectations)}]}}


BETWEEN = "expect_column_values_to_be_between"


def test_an_expectation_given_twice_in_a_suite_is_refused_naming_the_second():
    """Rows and dq_results name an expectation by suite, type and column: of two between-expectations on
    temperature (min 0; max 50) the row check kept the second only, so -5 reached silver unchecked."""
    section = suite_of(
        {"type": BETWEEN, "column": "temperature", "min_value": 0},
        {"type": "expect_column_values_to_not_be_null", "column": "temperature"},
        {"type": BETWEEN, "column": "temperature", "max_value": 50},
    )
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config(section)
    assert raised.value.path == "telemetry.quality.suites[0].expectations[2]", str(raised.value)
    assert "expectations[0]" in str(raised.value) and "one expectation" in str(raised.value)


def test_a_regex_that_does_not_compile_is_refused_naming_it():
    """'[a-' was accepted: the first batch's tasks failed on it (PatternSyntaxException), which the job
    took for a failure a restart fixes, and restarted the query for ever."""
    section = suite_of({"type": "expect_column_values_to_match_regex", "column": "device_id", "regex": "[a-"})
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config(section)
    assert raised.value.path == "telemetry.quality.suites[0].expectations[0].regex", str(raised.value)
    assert "not a regular expression" in str(raised.value)


@pytest.mark.parametrize("kind", [BETWEEN, "expect_column_value_lengths_to_be_between"])
def test_bounds_no_value_can_meet_are_refused_naming_the_maximum(kind):
    """min_value 125, max_value -40 (swapped) was accepted: every reading failed it, so the whole fleet's
    telemetry went to quarantine."""
    column = "temperature" if kind == BETWEEN else "firmware"
    section = suite_of({"type": kind, "column": column, "min_value": 125, "max_value": -40})
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config(section)
    assert raised.value.path == "telemetry.quality.suites[0].expectations[0].max_value", str(raised.value)
    assert "below min_value 125" in str(raised.value)


def test_equal_bounds_are_one_value_unless_strict():
    equal = {"type": BETWEEN, "column": "temperature", "min_value": 5, "max_value": 5}
    load_telemetry_config(suite_of(equal))
    with pytest.raises(ConfigError, match=r"expectations\[0\]\.max_value: .*strict"):
        load_telemetry_config(suite_of({**equal, "strict_max": True}))


@pytest.mark.parametrize(
    ("expectation", "path", "said"),
    [
        (  # Spark cast every firmware to a number: each batch failed (CAST_INVALID_INPUT), restarted for ever
            {"type": BETWEEN, "column": "firmware", "min_value": 0, "max_value": 3},
            "column",
            "'firmware' is string",
        ),
        (  # the query did not analyse: a Spark error naming no key
            {"type": BETWEEN, "column": "event_time", "min_value": 0},
            "column",
            "'event_time' is timestamp",
        ),
        (
            {"type": "expect_column_value_lengths_to_be_between", "column": "temperature", "max_value": 3},
            "column",
            "'temperature' is double",
        ),
        (  # 'hot' cast to a double failed every batch
            {"type": "expect_column_values_to_be_in_set", "column": "temperature", "value_set": [20, "hot"]},
            "value_set[1]",
            "'hot' is no double",
        ),
        (  # every group cast to a number failed every batch
            {"type": "expect_column_values_to_not_be_in_set", "column": "group", "value_set": [1]},
            "value_set[0]",
            "1 is no string",
        ),
        (
            {"type": "expect_column_values_to_be_in_set", "column": "seq", "value_set": [True]},
            "value_set[0]",
            "True is no bigint",
        ),
    ],
)
def test_an_expectation_its_column_cannot_meet_is_refused_naming_the_key(expectation, path, said):
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config(suite_of(expectation))
    assert raised.value.path == f"telemetry.quality.suites[0].expectations[0].{path}", str(raised.value)
    assert said in str(raised.value)


def test_values_of_the_columns_type_are_accepted():
    load_telemetry_config(
        suite_of(
            {"type": "expect_column_values_to_be_in_set", "column": "temperature", "value_set": [20, 21.5]},
            {"type": "expect_column_values_to_be_in_set", "column": "group", "value_set": ["a", None]},
            {"type": "expect_column_value_lengths_to_be_between", "column": "device_id", "max_value": 64},
            {"type": BETWEEN, "column": "offset", "min_value": 0},
        )
    )


@pytest.mark.parametrize(
    ("section", "path", "said"),
    [
        (
            {
                "payload": {
                    "topic_template": "sites/{site}/devices/{device_id}/telemetry",
                    "fields": {**load_telemetry_config(None).payload.fields, "site": "string"},
                },
                "gold": {"devices": {"tag_fields": ["site"]}},
            },
            "telemetry.gold.devices.tag_fields[0]",
            "'site' is also a {site} level of the topic template",
        ),
        (
            {
                "payload": {"fields": {**load_telemetry_config(None).payload.fields, "zone": "string"}},
                "gold": {"devices": {"tag_fields": ["zone", "zone"]}},
            },
            "telemetry.gold.devices.tag_fields[1]",
            "already gold.devices.tag_fields[0]",
        ),
    ],
)
def test_a_tag_named_twice_is_refused_naming_the_second(section, path, said):
    """devices.tags is a map: a tag field named twice, or named as a topic's {placeholder} level, made each
    batch's devices step fail with DUPLICATED_MAP_KEY, and the job restarted the query for ever."""
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config(section)
    assert raised.value.path == path, str(raised.value)
    assert said in str(raised.value)


def test_a_regex_java_does_not_read_is_refused_naming_it():
    """Spark reads the regex as Java does, Great Expectations as Python does: a Python named group
    '(?P<id>...)' compiled here and failed every batch's tasks (PatternSyntaxException), restarted for
    ever."""
    regex = "^(?P<site>[a-z]+)-[0-9]+$"
    section = suite_of({"type": "expect_column_values_to_match_regex", "column": "device_id", "regex": regex})
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config(section)
    assert raised.value.path == "telemetry.quality.suites[0].expectations[0].regex", str(raised.value)
    assert "(?P" in str(raised.value) and "Java" in str(raised.value)
