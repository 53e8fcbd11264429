"""Payload formats in the telemetry configuration: which format the payloads of each topic template are in.

A ``payload.formats`` entry names a topic template and its format; ``json``, ``cbor`` and ``protobuf``
payloads are read into the declared ``payload.fields``, ``sparkplug_b`` ones into one row per metric. Loaded
with :func:`broker_edge.config.loader.load_dataclass`, so every error names its dotted key
(``telemetry.payload.formats[1].protobuf.message``); what can only be checked against the files and the
fields (a descriptor set that cannot be read, a message lacking a declared field) is checked by
:func:`field_formats` before Spark starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from broker_edge.config.loader import ConfigError

from .descriptors import DescriptorSetError, message_class
from .formats import FieldFormat
from .protobuf import field_problem
from .sparkplug.topics import NAMESPACE

FormatName = Literal["json", "cbor", "protobuf", "sparkplug_b"]

_GROUP = re.compile(r"^(\{group_id\}|[^/#+{}]+)$")


@dataclass
class ProtobufConfig:
    """The message a ``protobuf`` topic's payloads are: a descriptor set file and the message's full name."""

    descriptor_set: str
    """A FileDescriptorSet (``protoc --include_imports --descriptor_set_out=FILE``), relative to the
    working directory; its bytes travel to the executors, so only the driver reads the file."""
    message: str
    """The message's full name, ``package.Message``."""

    def __post_init__(self) -> None:
        if not self.descriptor_set.strip():
            raise ConfigError("descriptor_set", "the path of a descriptor set is required")
        if not re.match(r"^[A-Za-z_][\w.]*$", self.message):
            raise ConfigError(
                "message", f"expected a message's full name (package.Message), got {self.message!r}"
            )


@dataclass
class TopicFormat:
    """One topic template and the format of its payloads."""

    topic_template: str
    format: FormatName = "json"
    protobuf: ProtobufConfig | None = None

    def __post_init__(self) -> None:
        if self.format == "protobuf" and self.protobuf is None:
            raise ConfigError(
                "protobuf", "format protobuf needs protobuf.descriptor_set and protobuf.message"
            )
        if self.format != "protobuf" and self.protobuf is not None:
            raise ConfigError("protobuf", f"only format protobuf takes it, not {self.format}")
        if self.format == "sparkplug_b":
            levels = self.topic_template.split("/")
            if len(levels) != 2 or levels[0] != NAMESPACE or not _GROUP.match(levels[1]):
                expected = f"{NAMESPACE}/{{group_id}} (every group) or {NAMESPACE}/<group>"
                raise ConfigError(
                    "topic_template", f"a sparkplug_b template is {expected}, got {self.topic_template!r}"
                )
            if levels[1] == "STATE":  # the Sparkplug B query leaves the host applications' topics out
                raise ConfigError(
                    "topic_template",
                    f"STATE is no group: {NAMESPACE}/STATE/<host_id> is a host application's (nothing read)",
                )

    @property
    def sparkplug_filter(self) -> str:
        """A ``sparkplug_b`` template's MQTT filter: its group's whole namespace (every group's for
        ``{group_id}``). The other formats' templates follow the telemetry job's rules (``TopicTemplate``)."""
        group = self.topic_template.split("/")[1]
        return f"{NAMESPACE}/{'+' if group == '{group_id}' else group}/#"


def check_sparkplug_groups(topic_template: str, formats: Sequence[TopicFormat]) -> None:
    """No telemetry template (``topic_template``, or another format's entry) in a Sparkplug B group a
    ``sparkplug_b`` entry reads: its payloads would be read twice, as readings (every one quarantined) and
    by the Sparkplug B query."""
    groups = {
        entry.topic_template.split("/")[1]: index
        for index, entry in enumerate(formats)
        if entry.format == "sparkplug_b"
    }
    templates = {"topic_template": topic_template} | {
        f"formats[{index}].topic_template": entry.topic_template
        for index, entry in enumerate(formats)
        if entry.format != "sparkplug_b"
    }
    for key, template in templates.items():
        levels = template.split("/")
        if levels[0] != NAMESPACE or len(levels) < 2:
            continue
        for group, index in groups.items():
            if group == "{group_id}" or group == levels[1] or levels[1].startswith("{"):
                raise ConfigError(
                    key,
                    f"its topics are in the Sparkplug B group(s) formats[{index}] reads: "
                    "their payloads would be read twice, once as readings",
                )


def check_formats(formats: Sequence[TopicFormat], path: str = "formats", whole: str | None = None) -> None:
    """No topic template twice (which format would win?); the first is named by ``whole``, the list's key
    from the file's top (``path`` is the key the error is raised at, which a loader may prefix)."""
    seen: dict[str, int] = {}
    for index, entry in enumerate(formats):
        if entry.topic_template in seen:
            first = seen[entry.topic_template]
            raise ConfigError(f"{path}[{index}].topic_template", f"already given at {whole or path}[{first}]")
        seen[entry.topic_template] = index


def field_formats(
    formats: Sequence[TopicFormat],
    fields: Mapping[str, str],
    path: str = "formats",
    event_time_field: str | None = None,
) -> dict[str, FieldFormat]:
    """The format of each template read into ``fields`` (not ``sparkplug_b``), its files read and checked
    against the fields: what the executors get; a Protobuf message's ``event_time_field`` left at its
    default is read as not sent. Errors name the key to change."""
    result: dict[str, FieldFormat] = {}
    for index, entry in enumerate(formats):
        where = f"{path}[{index}]"
        if entry.format == "sparkplug_b":
            continue
        if entry.format != "protobuf" or entry.protobuf is None:
            result[entry.topic_template] = FieldFormat(entry.format)
            continue
        config = entry.protobuf
        try:
            descriptor_set = Path(config.descriptor_set).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{where}.protobuf.descriptor_set", f"cannot read it: {exc.strerror}") from None
        try:
            message = message_class(descriptor_set, config.message)
        except DescriptorSetError as exc:
            key = "message" if str(exc).startswith("no message") else "descriptor_set"
            raise ConfigError(f"{where}.protobuf.{key}", str(exc)) from None
        for name, type_name in fields.items():
            problem = field_problem(message.DESCRIPTOR, name, type_name)
            if problem is not None:
                raise ConfigError(f"{where}.protobuf.message", f"payload field {name}: {problem}")
        unset_is_absent = () if event_time_field is None else (event_time_field,)
        result[entry.topic_template] = FieldFormat(
            "protobuf", descriptor_set, config.message, unset_is_absent
        )
    return result
