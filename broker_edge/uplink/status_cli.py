"""``timestone uplink status``: a hub's sites, or a site's link, as the broker's offsets API reports them."""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from broker_edge.config import ConfigError
from broker_edge.offsets_api.errors import TLS_CLIENT_REFUSED
from broker_edge.security.client_tls import ClientTls

__all__ = ["format_status", "uplink_main"]

_SITE_COLUMNS = ("site", "connected", "last contact", "lag records", "lag s", "records", "bytes", "gaps")


EXIT_STATUS = (
    "exit status: 0 printed; 1 the broker cannot be reached, has no uplink, or refused (its HTTP status is "
    "said); 2 a wrong command line"
)


def uplink_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="timestone uplink", description="The edge uplink.", epilog=EXIT_STATUS
    )
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser(
        "status", help="a hub's sites, or a site's link to its hub", epilog=EXIT_STATUS
    )
    status.add_argument("--broker", default="http://127.0.0.1:9884", help="the broker's offsets API URL")
    status.add_argument("--token", default=None, help="a reader's token, when the offsets API asks for one")
    status.add_argument("--json", action="store_true", help="print the broker's answer as JSON")
    status.add_argument(
        "--cafile",
        help="PEM file of the CAs an https:// broker's certificate must chain to (default: the system's)",
    )
    status.add_argument("--certfile", help="PEM file of the certificate to present (mutual TLS)")
    status.add_argument("--keyfile", help="PEM file of --certfile's key (default: in --certfile)")
    args = parser.parse_args(argv)
    if not _is_http_url(args.broker):
        parser.error(f"--broker {args.broker!r}: an http:// or https:// URL of the broker's offsets API")
    try:
        context = _tls(args)
    except ConfigError as error:
        parser.error(f"--{error.path}: {error.detail}")
    try:
        document = _fetch(args.broker, args.token, context)
        shown = json.dumps(document, indent=2) if args.json else format_status(document, time.time())
    except _Unanswered as reason:
        print(f"timestone uplink: {reason}", file=sys.stderr)
        return 1
    print(shown)
    return 0


def _is_http_url(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # "http://[::1"
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The client TLS the options ask for (None: the system's CAs); ``ConfigError`` naming its option."""
    if not (args.cafile or args.certfile or args.keyfile):
        return None
    return ClientTls(args.cafile, args.certfile, args.keyfile).context()


class _Unanswered(Exception):
    """Why the broker gave no uplink status (a message for the operator)."""


def _fetch(broker: str, token: str | None, context: ssl.SSLContext | None = None) -> Any:
    """The broker's ``/v1/uplink/sites`` answer, decoded; ``_Unanswered`` saying why there is none."""
    request = urllib.request.Request(broker.rstrip("/") + "/v1/uplink/sites")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            body = answer.read()
    except urllib.error.HTTPError as error:
        if error.code == 404 and _is_admin_endpoint(broker, context):
            raise _Unanswered(
                f"{broker} is a broker's admin endpoint (/metrics, /health), not its offsets API"
                " (offsets_api.port, 9884 by default)"
            ) from None
        if error.code == 404:
            raise _Unanswered(f"{broker} has no uplink (neither uplink: nor uplink_hub:)") from None
        raise _Unanswered(_refused(broker, error, token)) from None
    except urllib.error.URLError as error:
        raise _Unanswered(_unreached(broker, error.reason)) from None
    except (OSError, ValueError) as error:
        raise _Unanswered(_unreached(broker, error)) from None
    try:
        return json.loads(body)
    except ValueError:
        raise _Unanswered(
            f"{broker} answered something that is not JSON: is it a broker's offsets API?"
        ) from None


def _refused(broker: str, error: urllib.error.HTTPError, token: str | None) -> str:
    """Why ``broker`` refused the request, with the message its answer gives; for a 401, what to give."""
    try:
        why = f"{error.code}: {json.loads(error.read())['message']}"
    except (OSError, ValueError, KeyError, TypeError):
        why = str(error.code)
    if error.code != 401:
        return f"{broker} answered {why}"
    if token:
        return f"{broker} refused the token: give a reader token of its offsets API ({why})"
    return f"{broker} needs a reader token of its offsets API: give --token ({why})"


def _unreached(broker: str, error: object) -> str:
    """Why ``broker`` gave no answer: a TLS refusal or distrust said as such, naming the options."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"{broker}: its certificate is not trusted: {error} (see --cafile, --certfile, --keyfile)"
    if isinstance(error, ssl.SSLError) and error.reason in TLS_CLIENT_REFUSED:
        return (
            f"{broker}: it refused this client's certificate: {error} (see --cafile, --certfile, --keyfile)"
        )
    return f"cannot reach {broker}: {error}"


def _is_admin_endpoint(broker: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether ``broker``'s host and port answer ``/health`` as a broker's admin endpoint does (a JSON object
    with ``status``), which the offsets API never serves; a path given with it (``/metrics``) is left out."""
    parts = urllib.parse.urlsplit(broker)
    origin = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else broker.rstrip("/")
    health = f"{origin}/health"
    try:
        with urllib.request.urlopen(health, timeout=10, context=context) as answer:
            body = answer.read(65536)
    except urllib.error.HTTPError as error:
        body = error.read(65536) if error.code == 503 else b""
    except (urllib.error.URLError, OSError, ValueError):
        return False
    try:
        report = json.loads(body)
    except ValueError:
        return False
    return isinstance(report, dict) and "status" in report


def format_status(document: Any, now: float) -> str:
    """The answer of ``/v1/uplink/sites`` as a table: one row per site (a hub) or the one link (a site);
    ``_Unanswered`` when it is not such an answer."""
    try:
        return _table(document, now)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise _Unanswered(f"the answer is not an uplink status ({type(error).__name__}: {error})") from None


def _table(document: dict[str, Any], now: float) -> str:
    if document.get("role") == "site":
        site = document["site"]
        rows = [
            _row(
                {**site, "received_records": site["sent_records"], "received_bytes": site["sent_bytes"]}, now
            )
        ]
        title = f"site {site['site']} -> {site.get('hub') or '(no hub reached yet)'}"
    else:
        rows = [_row(site, now) for site in document.get("sites", [])]
        title = f"hub: {len(rows)} site(s)"
    widths = [max([len(column), *(len(row[i]) for row in rows)]) for i, column in enumerate(_SITE_COLUMNS)]
    lines = [
        title,
        "  ".join(column.ljust(width) for column, width in zip(_SITE_COLUMNS, widths, strict=True)),
    ]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def _row(site: dict[str, Any], now: float) -> list[str]:
    contact = site.get("last_contact")
    return [
        str(site["site"]),
        "yes" if site["connected"] else "no",
        f"{now - contact:.0f} s ago" if contact else "never",
        str(site["lag_records"]),
        f"{site['lag_seconds']:.1f}",
        str(site["received_records"]),
        str(site["received_bytes"]),
        str(site["gap_records"]),
    ]
