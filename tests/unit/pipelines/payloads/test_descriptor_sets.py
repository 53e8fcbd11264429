"""The descriptor sets shipped are their ``.proto`` files compiled: compiled again here and compared."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from pipelines.payloads import examples
from pipelines.payloads.sparkplug import schema

SHIPPED = [
    (Path(schema.__file__).parent, "sparkplug_b"),
    (Path(examples.__file__).parent, "telemetry"),
]


def compile_proto(proto_dir: Path, name: str, out: Path) -> bytes:
    """``name`` (in ``proto_dir``) compiled by grpcio-tools' protoc into a descriptor set."""
    well_known = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    status = protoc.main(
        [
            "protoc",
            f"--proto_path={proto_dir}",
            f"--proto_path={well_known}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            name,
        ]
    )
    assert status == 0, f"protoc failed on {name}"
    return out.read_bytes()


@pytest.mark.parametrize(("folder", "name"), SHIPPED)
def test_the_descriptor_set_is_the_proto_compiled(tmp_path, folder, name):
    compiled = descriptor_pb2.FileDescriptorSet.FromString(
        compile_proto(folder, f"{name}.proto", tmp_path / f"{name}.desc")
    )
    shipped = descriptor_pb2.FileDescriptorSet.FromString((folder / f"{name}.desc").read_bytes())
    assert [file.name for file in shipped.file] == [f"{name}.proto"]
    assert shipped == compiled


def test_the_payload_has_the_specifications_fields_and_numbers():
    payload = schema.payload_class().DESCRIPTOR
    assert payload.full_name == "org.eclipse.tahu.protobuf.Payload"
    assert {f.name: f.number for f in payload.fields} == {
        "timestamp": 1, "metrics": 2, "seq": 3, "uuid": 4, "body": 5,
    }  # fmt: skip
    metric = payload.fields_by_name["metrics"].message_type
    values = {f.name: f.number for f in metric.oneofs_by_name["value"].fields}
    assert values["int_value"] == 10 and values["double_value"] == 13 and values["extension_value"] == 19


def test_the_datatype_names_are_the_enums():
    enum = schema.payload_class().DESCRIPTOR.file.enum_types_by_name["DataType"]
    assert {v.number: v.name for v in enum.values} == schema.DATATYPES
    assert schema.DATATYPES[10] == "Double" and schema.DATATYPES[34] == "DateTimeArray"
