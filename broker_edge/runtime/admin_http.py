"""The broker's admin HTTP endpoint: ``GET /metrics`` for Prometheus and ``GET /health`` for orchestrators.

It is separate from the MQTT listeners and from the offsets API so it can stay on loopback (or a management
network) while devices reach the broker elsewhere, and so a scrape never competes with data traffic.
It runs on the broker's event loop; neither handler blocks, and pages of `/metrics` take at most a tenth
of the loop's time however many ask (`MetricsPages`). The broker builds this app with the first connection
to its port (`lazy_http`); its config section, `AdminHttpConfig`, lives with the others in `config.broker`
(and is re-exported here) so that loading a config imports no HTTP stack.
"""

from __future__ import annotations

import json
import logging
import ssl as ssl_module
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from broker_edge.http.guard import GuardedRunner, start_guarded_site
from broker_edge.http.json_errors import http_errors_in_json
from broker_edge.observe.metrics import BrokerMetrics
from broker_edge.observe.metrics_pages import MetricsPages
from broker_edge.settings.broker import DEFAULT_ADMIN_PORT, AdminHttpConfig

__all__ = ["DEFAULT_ADMIN_PORT", "AdminHttpConfig", "create_admin_app", "start_admin_server"]

log = logging.getLogger(__name__)
_PAGES_KEY = web.AppKey("metrics_pages", MetricsPages)
_HEALTH_KEY: web.AppKey[Callable[[], dict[str, object]]] = web.AppKey("health")


def create_admin_app(metrics: BrokerMetrics, health: Callable[[], dict[str, Any]]) -> web.Application:
    """The aiohttp app; ``health()`` returns a JSON-able dict whose ``"status"`` is ``"ok"`` when healthy.

    ``/health`` answers 200 with that dict when the status is ``"ok"``, else 503 with it, so load balancers
    and Kubernetes probes need no parsing. A ``health`` that raises is reported as 503, not 500: the broker
    is then not healthy, whatever the cause.
    """
    app = web.Application(middlewares=[http_errors_in_json])
    app[_PAGES_KEY] = MetricsPages(metrics)
    app[_HEALTH_KEY] = health
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    return app


async def _metrics(request: web.Request) -> web.Response:
    """Prometheus text format, or OpenMetrics when the scraper asks for it in ``Accept`` (an ``Accept`` that
    cannot be read gets the text format). The page is built after the request arrived, at most a tenth of
    the loop's time going to pages however many ask (``MetricsPages``)."""
    try:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    except (ValueError, TypeError):  # e.g. "version=banana"
        encode, content_type = choose_encoder("")
    body = await request.app[_PAGES_KEY].page(encode, content_type)
    return web.Response(body=body, headers={"Content-Type": content_type})


async def _health(request: web.Request) -> web.Response:
    try:
        report = dict(request.app[_HEALTH_KEY]())
    except Exception as exc:  # the probe must answer whatever went wrong
        log.exception("health check failed")
        report = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    status = 200 if report.get("status") == "ok" else 503
    return web.json_response(report, status=status, dumps=_dumps)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str)


async def start_admin_server(
    app: web.Application,
    host: str,
    port: int,
    ssl: ssl_module.SSLContext | None = None,
    max_connections: int = 64,
    request_timeout_s: float = 10.0,
) -> tuple[GuardedRunner, int]:
    """Serve ``app`` on ``host:port``; return the runner (``await runner.cleanup()`` stops it) and the port.

    The bound port is returned because ``port=0`` picks a free one. Connections beyond ``max_connections``
    get 503; one whose request headers take longer than ``request_timeout_s`` is closed.
    """
    runner = await start_guarded_site(app, host, port, ssl, max_connections, request_timeout_s)
    return runner, runner.port
