"""``payload.formats`` as YAML gives it: each mistake names its dotted key, files are checked before Spark."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import yaml

from broker_edge.config.loader import ConfigError, load_dataclass
from pipelines.payloads.config import TopicFormat, check_formats, field_formats
from pipelines.payloads.protobuf import EXAMPLE_MESSAGE, example_descriptor_set

FIELDS = {"ts": "bigint", "temperature": "double", "firmware": "string"}


@dataclass
class Section:
    """A stand-in for the section that holds the list, as the telemetry configuration does."""

    formats: list[TopicFormat] = field(default_factory=list)


def load(text: str) -> list[TopicFormat]:
    formats = load_dataclass(Section, yaml.safe_load(text), "telemetry.payload").formats
    check_formats(formats, "telemetry.payload.formats")
    return formats


def test_each_format_with_what_it_needs(tmp_path):
    descriptor = tmp_path / "telemetry.desc"
    descriptor.write_bytes(example_descriptor_set())
    formats = load(
        f"""
        formats:
          - {{topic_template: "devices/{{device_id}}/cbor", format: cbor}}
          - topic_template: "devices/{{device_id}}/pb"
            format: protobuf
            protobuf: {{descriptor_set: {descriptor}, message: {EXAMPLE_MESSAGE}}}
          - {{topic_template: "spBv1.0/{{group_id}}", format: sparkplug_b}}
          - {{topic_template: "spBv1.0/plant1", format: sparkplug_b}}
        """
    )
    readers = field_formats(formats, FIELDS, "telemetry.payload.formats")
    assert {t: f.name for t, f in readers.items()} == {
        "devices/{device_id}/cbor": "cbor",
        "devices/{device_id}/pb": "protobuf",
    }
    assert readers["devices/{device_id}/pb"].descriptor_set == example_descriptor_set()
    assert [f.sparkplug_filter for f in formats[2:]] == ["spBv1.0/+/#", "spBv1.0/plant1/#"]


T = "t/{device_id}"
PROTOBUF = {"descriptor_set": "a.desc", "message": "acme.Reading"}


@pytest.mark.parametrize(
    ("entries", "key", "message"),
    [
        ([{"topic_template": T, "format": "xml"}], "[0].format",
         "expected one of 'json', 'cbor', 'protobuf', 'sparkplug_b'"),
        ([{"topic_template": T, "format": "protobuf"}], "[0].protobuf",
         "format protobuf needs protobuf.descriptor_set and protobuf.message"),
        ([{"topic_template": T, "format": "cbor", "protobuf": PROTOBUF}], "[0].protobuf",
         "only format protobuf takes it, not cbor"),
        ([{"topic_template": T, "format": "protobuf", "protobuf": {"descriptor_set": "a.desc"}}],
         "[0].protobuf.message", "required key is missing"),
        ([{"topic_template": T, "format": "protobuf", "protobuf": {**PROTOBUF, "message": "x y"}}],
         "[0].protobuf.message", "expected a message's full name"),
        ([{"topic_template": "spBv1.0/#", "format": "sparkplug_b"}], "[0].topic_template",
         "a sparkplug_b template is spBv1.0/{group_id} (every group) or spBv1.0/<group>"),
        ([{"topic_template": "spBv1.0/STATE", "format": "sparkplug_b"}], "[0].topic_template",
         "STATE is no group: spBv1.0/STATE/<host_id> is a host application's (nothing read)"),
        ([{"topic_template": T}, {"topic_template": T, "format": "cbor"}], "[1].topic_template",
         "already given at telemetry.payload.formats[0]"),
        ([{"topic_template": T, "colour": "red"}], "[0].colour", "unknown key"),
    ],
)  # fmt: skip
def test_a_mistake_names_its_key(entries, key, message):
    with pytest.raises(ConfigError) as error:
        formats = load_dataclass(Section, {"formats": entries}, "telemetry.payload").formats
        check_formats(formats, "telemetry.payload.formats")
    assert error.value.path == f"telemetry.payload.formats{key}"
    assert message in error.value.detail


def protobuf_entry(descriptor_set: str, message: str = EXAMPLE_MESSAGE) -> list[TopicFormat]:
    protobuf = {"descriptor_set": descriptor_set, "message": message}
    entry = {"topic_template": T, "format": "protobuf", "protobuf": protobuf}
    return load_dataclass(Section, {"formats": [entry]}).formats


def test_the_descriptor_set_and_the_message_are_checked_against_the_fields(tmp_path):
    missing = tmp_path / "missing.desc"
    with pytest.raises(
        ConfigError, match=r"formats\[0\]\.protobuf\.descriptor_set: cannot read it: No such file"
    ):
        field_formats(protobuf_entry(str(missing)), FIELDS)
    junk = tmp_path / "junk.desc"
    junk.write_bytes(b"\xff\xff")
    with pytest.raises(ConfigError, match=r"descriptor_set: not a protobuf FileDescriptorSet"):
        field_formats(protobuf_entry(str(junk)), FIELDS)
    good = tmp_path / "telemetry.desc"
    good.write_bytes(example_descriptor_set())
    with pytest.raises(ConfigError, match=r"protobuf\.message: no message 'acme.Reading'"):
        field_formats(protobuf_entry(str(good), "acme.Reading"), FIELDS)
    with pytest.raises(
        ConfigError, match=r"protobuf\.message: payload field pressure: .* has no field 'pressure'"
    ):
        field_formats(protobuf_entry(str(good)), {**FIELDS, "pressure": "double"})
