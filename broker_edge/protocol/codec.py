"""The sans-IO MQTT codec: ``PacketDecoder.feed`` (bytes → packets) and ``encode`` (packets → bytes)."""

from .decoder import MAX_PACKET_SIZE, PacketDecoder, Role, SharedDecoder, shared_decoder, shared_like
from .encoder import (
    PublishTemplate,
    around_packet_id,
    encode,
    encode_puback_coded,
    encode_puback_success,
    encode_pubacks,
    encode_publish_template,
    qos0_frame_of,
)

__all__ = [
    "MAX_PACKET_SIZE",
    "PacketDecoder",
    "PublishTemplate",
    "Role",
    "SharedDecoder",
    "around_packet_id",
    "encode",
    "encode_puback_coded",
    "encode_puback_success",
    "encode_pubacks",
    "encode_publish_template",
    "qos0_frame_of",
    "shared_decoder",
    "shared_like",
]
