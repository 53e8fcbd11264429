"""Errors of the offsets API as the client raises them; the `code` strings are what the server sends."""

from __future__ import annotations

BAD_REQUEST = "bad_request"
BAD_OFFSET = "bad_offset"
UNAUTHORIZED = "unauthorized"
UNKNOWN_TOPIC = "unknown_topic"
OFFSET_OUT_OF_RANGE = "offset_out_of_range"
CORRUPT_RECORD = "corrupt_record"
LOG_UNREADABLE = "log_unreadable"
POSITION_OUT_OF_RANGE = "position_out_of_range"
NOT_FOUND = "not_found"
FORMAT_UNAVAILABLE = "format_unavailable"
FORBIDDEN = "forbidden"
BUSY = "busy"
EXPECTATION_FAILED = "expectation_failed"


NO_OFFSETS_API = (
    "no offsets API there (is the URL the broker's offsets_api address, not its admin_http one or another "
    "server's?)"
)
"""What a reader says of a 404 to its listing (``GET /v1/logs``), which every offsets API serves: the
address is another server's (a broker's admin HTTP port, given for its offsets API, answers so)."""


class OffsetsApiError(Exception):
    """An error answer of the offsets API (`status` HTTP status, `code` machine-readable)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class BadRequestError(OffsetsApiError):
    """400: a malformed parameter or body (including an offset that is not a number)."""


class AuthError(OffsetsApiError):
    """401: the bearer token is missing or wrong."""


class ForbiddenError(AuthError):
    """403: the token may not read that topic (its filters do not match it)."""

    def __init__(self, status: int, code: str, message: str, topic: str) -> None:
        super().__init__(status, code, message)
        self.topic = topic


class UnknownTopicError(OffsetsApiError):
    """404: the broker has no log for the topic."""

    def __init__(self, status: int, code: str, message: str, topic: str) -> None:
        super().__init__(status, code, message)
        self.topic = topic


class OffsetOutOfRangeError(OffsetsApiError):
    """416: the offset is outside [start, end]; `start` tells where the log begins now."""

    def __init__(self, status: int, code: str, message: str, topic: str, offset: int, start: int, end: int):
        super().__init__(status, code, message)
        self.topic = topic
        self.offset = offset
        self.start = start
        self.end = end


class CorruptRecordError(OffsetsApiError):
    """500: the record at `offset` failed its checksum on the broker; `next_offset` is past the damage."""

    def __init__(self, status: int, code: str, message: str, topic: str, offset: int, next_offset: int):
        super().__init__(status, code, message)
        self.topic = topic
        self.offset = offset
        self.next_offset = next_offset


class PositionOutOfRangeError(OffsetsApiError):
    """416: the position is outside the partition's [start, end]; `start` tells where it begins now."""

    def __init__(
        self, status: int, code: str, message: str, partition: int, position: int, start: int, end: int
    ) -> None:
        super().__init__(status, code, message)
        self.partition = partition
        self.position = position
        self.start = start
        self.end = end


class BrokerUnavailable(Exception):
    """The broker could not be reached (or kept failing) after the configured retries."""


class TlsRefused(BrokerUnavailable):
    """The TLS handshake failed for a reason no retry mends: the broker's certificate is not trusted (another
    CA, expired, another host's name), or the broker refused this client's certificate (none, another CA's,
    revoked). Raised at once, without retries."""


TLS_CLIENT_REFUSED = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)
"""OpenSSL's reasons for the alerts a server sends when it refuses the client's certificate (TLS 1.2's for
none where one is required is ``handshake failure``, also said of TLS settings the two sides do not share:
no retry mends either)."""


def error_from_body(status: int, body: dict) -> OffsetsApiError:
    """The typed error for an error answer (`body` is its JSON object)."""
    code = str(body.get("error", "unknown"))
    message = str(body.get("message", ""))
    if status == 401:
        return AuthError(status, code, message)
    if code == FORBIDDEN:
        return ForbiddenError(status, code, message, body.get("topic", ""))
    if code == UNKNOWN_TOPIC:
        return UnknownTopicError(status, code, message, body.get("topic", ""))
    if code == OFFSET_OUT_OF_RANGE:
        return OffsetOutOfRangeError(
            status,
            code,
            message,
            body.get("topic", ""),
            body["offset"],
            body["start_offset"],
            body["end_offset"],
        )
    if code == POSITION_OUT_OF_RANGE:
        return PositionOutOfRangeError(
            status,
            code,
            message,
            body["partition"],
            body["position"],
            body["start_position"],
            body["end_position"],
        )
    if code == CORRUPT_RECORD:
        return CorruptRecordError(
            status, code, message, body.get("topic", ""), body["offset"], body["next_offset"]
        )
    if status == 400:
        return BadRequestError(status, code, message)
    return OffsetsApiError(status, code, message)
