"""``timestone sparkplug-host``: Timestone's Sparkplug B host application on one MQTT server."""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys

from broker_edge.config import ConfigError
from broker_edge.observe.logs import LoggingConfig, configure_logging
from broker_edge.offsets_api.errors import TLS_CLIENT_REFUSED
from broker_edge.protocol import ReasonCode
from broker_edge.security.client_tls import ClientTls
from pipelines.fleet.cli import broker_address, signal_stop, zero_or_more
from pipelines.fleet.client import ConnectionRefused
from pipelines.sparkplug_host.host import SparkplugHost

#: The longest host id: its client id, ``sparkplug-host-<host_id>``, is an MQTT string (65535 bytes of UTF-8).
MOST_HOST_ID_BYTES = 65535 - len("sparkplug-host-")


def host_id(text: str) -> str:
    """A Sparkplug host id: one topic level (``spBv1.0/STATE/<host_id>``), so no ``/``, ``+`` or ``#``, and
    within what its client id may hold."""
    if not text:
        raise argparse.ArgumentTypeError("a host id is not empty")
    if any(character in text for character in "/+#"):
        raise argparse.ArgumentTypeError(f"a host id has no '/', '+' or '#', got {text!r}")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # bytes of the command line that are no UTF-8, as Python keeps them
        raise argparse.ArgumentTypeError(f"a host id is UTF-8 text, got {text!r}") from None
    if size > MOST_HOST_ID_BYTES:
        raise argparse.ArgumentTypeError(
            f"a host id is at most {MOST_HOST_ID_BYTES} bytes of UTF-8, got {size}"
        )
    return text


def seconds(text: str) -> float:
    """A number of seconds, 0 or more (not NaN, not infinite): the simulator's ``zero_or_more``, said as
    seconds."""
    try:
        return zero_or_more(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected seconds, 0 or more, got {text!r}") from None


def delay(text: str) -> float:
    """Seconds more than 0 (finite): a delay of 0 would try to connect again without pause."""
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds, more than 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timestone sparkplug-host",
        description="Publish this host application's Sparkplug B STATE (online while it runs, its will "
        "offline) and ask edge nodes whose births it has not seen or cannot read, or whose sequence numbers "
        "stay out of order, for a rebirth.",
        epilog="exit status: 0 stopped (Ctrl-C, SIGTERM); 1 the broker cannot be reached or refused it "
        "(CONNACK reason, TLS alert), or another host with this id took its connection over; 2 a wrong "
        "command line; 3 optional dependencies missing. A "
        "lost connection (a broker restart) is made again every --reconnect-delay seconds.",
    )
    parser.add_argument(
        "--broker",
        type=broker_address,
        default=("127.0.0.1", 1883),
        help="HOST:PORT (default 127.0.0.1:1883)",
    )
    parser.add_argument(
        "--host-id", type=host_id, default="timestone", help="the Sparkplug host id (default timestone)"
    )
    parser.add_argument(
        "--rebirth-interval", type=seconds, default=30.0, help="seconds between two requests to one node"
    )
    parser.add_argument(
        "--reorder-timeout",
        type=seconds,
        default=2.0,
        help="seconds a born node's sequence numbers skipped may take to arrive (or after one repeated) "
        "before the node is asked for a rebirth (default 2; 0: at once)",
    )
    parser.add_argument(
        "--reconnect-delay",
        type=delay,
        default=1.0,
        help="seconds between two attempts to connect again once the connection is lost (default 1)",
    )
    parser.add_argument("--username", help="the user name to log in with (default: none, anonymous)")
    parser.add_argument(
        "--password-file",
        type=password_file,
        help="a file holding the password of --username (its first line)",
    )
    parser.add_argument(
        "--tls", action="store_true", help="MQTT over TLS (implied by --cafile and --certfile)"
    )
    parser.add_argument(
        "--cafile", help="PEM file of the CAs the broker's certificate must chain to (default: the system's)"
    )
    parser.add_argument("--certfile", help="PEM file of the certificate to present (mutual TLS)")
    parser.add_argument("--keyfile", help="PEM file of --certfile's key (default: in --certfile)")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="INFO",
        help="lowest level logged to standard error (default INFO: a lost connection, its return; DEBUG "
        "also each rebirth request and each attempt to connect again)",
    )
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="text, or JSON lines")
    return parser


def tls_of(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS the command line asks for (None: plain MQTT); ``ConfigError`` naming the option whose file
    does not load."""
    if not (args.tls or args.cafile or args.certfile or args.keyfile):
        return None
    try:
        return ClientTls(args.cafile, args.certfile, args.keyfile).context()
    except ConfigError as error:
        raise ConfigError(f"--{error.path}", error.detail) from None


def password_file(text: str) -> bytes:
    """The password in the file ``text`` names: its first line, without the line's end."""
    try:
        with open(text, "rb") as file:
            return file.readline().rstrip(b"\r\n")
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {error.strerror}") from None


def host_of(args: argparse.Namespace) -> SparkplugHost:
    """The host application the command line asks for."""
    host, port = args.broker
    return SparkplugHost(
        host,
        port,
        args.host_id,
        rebirth_interval_s=args.rebirth_interval,
        reorder_timeout_s=args.reorder_timeout,
        retry_s=args.reconnect_delay,
        username=args.username,
        password=args.password_file,
        ssl_context=tls_of(args),
    )


def _tls_failure(host: str, port: int, error: ssl.SSLError) -> str:
    """What a TLS error at connect says: the broker refused this client's certificate (its alert), its own
    certificate is not trusted, or TLS failed otherwise (a connection closed in the handshake)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        what = "its certificate is not trusted"
    elif error.reason in TLS_CLIENT_REFUSED:
        what = "it refused this client's certificate"
    else:
        what = "TLS failed"
    return f"{host}:{port}: {what}: {error} (see --cafile, --certfile, --keyfile)"


def _unreachable(host: str, port: int, error: OSError, tls: ssl.SSLContext | None) -> str:
    """Why the broker could not be reached; over TLS, a connection reset in the handshake (asyncio's error
    says nothing) is most often a plain MQTT listener closing it on the ClientHello."""
    if tls is not None and isinstance(error, ConnectionResetError) and not str(error):
        return (
            f"{host}:{port}: TLS failed: the connection closed during the TLS handshake (a plain MQTT "
            "listener? it is reached without --tls, --cafile, --certfile)"
        )
    return f"cannot reach {host}:{port}: {error}"


async def _run(args: argparse.Namespace) -> int:
    host, port = args.broker
    try:
        sparkplug = host_of(args)
    except ConfigError as error:
        print(f"timestone sparkplug-host: {error}", file=sys.stderr)
        return 2
    stop = signal_stop()
    try:
        await sparkplug.start()
    except ConnectionRefused as refused:
        reason = _reason_name(refused.reason_code)
        print(
            f"timestone sparkplug-host: {host}:{port} refused the connection: "
            f"0x{refused.reason_code:02x} {reason} (client id sparkplug-host-{args.host_id})",
            file=sys.stderr,
        )
        return 1
    except ssl.SSLError as error:
        print(f"timestone sparkplug-host: {_tls_failure(host, port, error)}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"timestone sparkplug-host: {_unreachable(host, port, error, tls_of(args))}", file=sys.stderr)
        return 1
    print(f"Sparkplug B host {args.host_id} online on {host}:{port} ({sparkplug.topic})", flush=True)
    if not await sparkplug.run(stop):
        print(
            f"timestone sparkplug-host: another client connected as {args.host_id}'s host application "
            f"(client id sparkplug-host-{args.host_id}) on {host}:{port}; it stays online, this one stops",
            file=sys.stderr,
        )
        return 1
    return 0


def _reason_name(code: int) -> str:
    """An MQTT 5 reason code's name as the specification writes it, in lower case."""
    try:
        return ReasonCode(code).name.replace("_", " ").lower()
    except ValueError:
        return "a reason code MQTT does not define"


def sparkplug_host_main(argv: list[str]) -> int:
    """Entry point of ``timestone sparkplug-host``: its log on standard error, formatted as the broker's."""
    args = build_parser().parse_args(argv)
    configure_logging(LoggingConfig(level=args.log_level, format=args.log_format))
    return asyncio.run(_run(args))
