"""A simulated device's reading, written in the payload format its fleet sends: JSON, CBOR or Protobuf.

The same fields in each (docs/device-protocol.md): the Protobuf message is the example schema
``pipelines/payloads/examples/telemetry.proto``, which the telemetry job reads with its descriptor set.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

#: The formats a simulated fleet's devices can send their readings in (Sparkplug B has its own edge nodes).
READING_FORMATS = ("json", "cbor", "protobuf")

Encoder = Callable[[dict[str, Any]], bytes]


@cache
def reading_encoder(payload_format: str) -> Encoder:
    """How a device of a fleet sending ``payload_format`` writes its reading (one per process)."""
    if payload_format == "json":
        return lambda reading: json.dumps(reading).encode()
    if payload_format == "cbor":  # cbor2 and protobuf come with timestone[pipelines]: imported when asked for
        import cbor2

        return cbor2.dumps
    if payload_format == "protobuf":
        from pipelines.payloads.descriptors import message_class
        from pipelines.payloads.protobuf import EXAMPLE_MESSAGE, example_descriptor_set

        telemetry = message_class(example_descriptor_set(), EXAMPLE_MESSAGE)
        return lambda reading: bytes(telemetry(**reading).SerializeToString())
    raise ValueError(f"unknown reading format {payload_format!r}; one of {', '.join(READING_FORMATS)}")
