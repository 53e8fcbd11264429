"""Protocol errors carrying the reason code the connection should send before it closes."""

from .reason_codes import ConnectReturnCode, ReasonCode

MESSAGE_MOST = 400
"""Characters of an error's message kept, the rest cut (``…``): a message quoting what a client sent (a topic
of 65,535 bytes, each control character 4 in a quote) must still fit the reason string of the DISCONNECT or
SUBACK that carries it (65,535 bytes of UTF-8) and a log line."""


class MQTTError(Exception):
    """Base of every protocol error; ``reason_code`` is what a v5 DISCONNECT (or CONNACK) should carry.

    ``packets_before`` holds the packets that the same ``PacketDecoder.feed`` call decoded before the bad
    one, so a connection can still act on them before it closes.
    """

    default_reason_code: int = ReasonCode.UNSPECIFIED_ERROR
    protocol_level: int | None = None
    """Of an error in a first packet (a CONNECT): the protocol level it named, when that was read before the
    error (an MQTT 5 client is told the reason code in a CONNACK; an older one has codes for none of them)."""

    def __init__(self, message: str, reason_code: int | None = None) -> None:
        if len(message) > MESSAGE_MOST:
            message = message[: MESSAGE_MOST - 1] + "…"
        super().__init__(message)
        self.reason_code: int = self.default_reason_code if reason_code is None else reason_code
        self.message = message
        self.packets_before: list = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason_code=0x{self.reason_code:02X}, message={self.message!r})"


class MalformedPacket(MQTTError):
    """The bytes cannot be parsed as the spec describes (0x81)."""

    default_reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolError(MQTTError):
    """The packet parses but carries something the protocol forbids (0x82 unless a sharper code exists)."""

    default_reason_code = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(ProtocolError):
    """The packet is larger than the receiver's maximum packet size (0x95); raised before the body arrives."""

    default_reason_code = ReasonCode.PACKET_TOO_LARGE


class TooManyElements(ProtocolError):
    """A packet holds more elements (topic filters, user properties) than the receiver's limit (0x97 Quota
    exceeded); raised at the first one past it, before the rest is decoded."""

    default_reason_code = ReasonCode.QUOTA_EXCEEDED

    def __init__(self, element: str, limit: int) -> None:
        super().__init__(f"more than {limit} {element.replace('_', ' ')} in one packet")
        self.element = element
        """What was counted: ``subscribe_filters``, ``user_properties``, ``subscription_identifiers``."""
        self.limit = limit


class InvalidTopic(ProtocolError):
    """A topic name (0x90) or topic filter (0x8F) breaks the topic rules."""

    default_reason_code = ReasonCode.TOPIC_NAME_INVALID


class UnsupportedProtocolVersion(ProtocolError):
    """CONNECT names a protocol this decoder does not speak.

    The server should answer CONNACK ``return_code`` (0x01) in v3 format, or ``reason_code`` (0x84) if it
    chooses to answer in v5 format, then close.
    """

    default_reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    return_code: int = ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION

    def __init__(self, message: str, protocol_name: str, protocol_version: int) -> None:
        super().__init__(message)
        self.protocol_name = protocol_name
        self.protocol_version = protocol_version
