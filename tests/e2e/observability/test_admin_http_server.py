"""The admin endpoint over real HTTP on a loopback port: /metrics for Prometheus, /health for probes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.observe.metrics import BrokerMetrics
from broker_edge.runtime.admin_http import (
    DEFAULT_ADMIN_PORT,
    AdminHttpConfig,
    create_admin_app,
    start_admin_server,
)
from broker_edge.security.tls import TlsConfig, server_ssl_context
from tests.tls_certs import client_ssl_context, make_test_pki


async def fetch(
    metrics: BrokerMetrics, health: Callable[[], dict[str, Any]], path: str, **server_options: Any
) -> tuple[int, str, str]:
    """Start the admin server on port 0, GET ``path``, stop it; (status, content type, body)."""
    client_ssl = server_options.pop("client_ssl", None)
    headers = server_options.pop("headers", None)
    runner, port = await start_admin_server(
        create_admin_app(metrics, health), "127.0.0.1", 0, **server_options
    )
    scheme = "https" if client_ssl else "http"
    try:
        assert port > 0
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"{scheme}://localhost:{port}{path}", ssl=client_ssl or False, headers=headers
            ) as response,
        ):
            return response.status, response.headers["Content-Type"], await response.text()
    finally:
        await runner.cleanup()


def get(metrics: BrokerMetrics, health: Callable[[], dict[str, Any]], path: str, **options: Any):
    return asyncio.run(asyncio.wait_for(fetch(metrics, health, path, **options), 20))


def ok() -> dict[str, Any]:
    return {"status": "ok", "logs": 3}


def test_metrics_endpoint_serves_the_brokers_registry() -> None:
    metrics = BrokerMetrics()
    metrics.for_listener("tcp").received[1].inc(7)
    other = BrokerMetrics()
    other.for_listener("tcp").received[1].inc(1000)
    status, content_type, body = get(metrics, ok, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    assert values[("timestone_broker_messages_received_total", (("listener", "tcp"), ("qos", "1")))] == 7


def test_metrics_in_openmetrics_when_asked() -> None:
    metrics = BrokerMetrics()
    metrics.log_appends_total.inc(2)
    accept = "application/openmetrics-text; version=1.0.0"
    status, content_type, body = get(metrics, ok, "/metrics", headers={"Accept": accept})
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n")
    assert "timestone_broker_log_appends_total 2.0" in body


def test_health_ok_is_200_with_the_report() -> None:
    status, content_type, body = get(BrokerMetrics(), ok, "/health")
    assert status == 200
    assert content_type.startswith("application/json")
    assert body == '{"status": "ok", "logs": 3}'


def test_health_not_ok_is_503() -> None:
    status, _, body = get(BrokerMetrics(), lambda: {"status": "degraded", "reason": "disk full"}, "/health")
    assert status == 503
    assert '"reason": "disk full"' in body


def test_health_check_that_raises_is_503() -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("store closed")

    status, _, body = get(BrokerMetrics(), broken, "/health")
    assert status == 503
    assert "RuntimeError: store closed" in body


def test_unknown_path_is_404_in_json_as_every_endpoint_answers() -> None:
    status, content_type, body = get(BrokerMetrics(), ok, "/nope")
    assert (status, content_type) == (404, "application/json; charset=utf-8")
    assert json.loads(body) == {"error": "not_found", "message": "Not Found"}


def test_another_method_is_405_in_json_naming_the_methods_the_path_takes() -> None:
    async def post() -> tuple[int, str, str]:
        runner, port = await start_admin_server(create_admin_app(BrokerMetrics(), ok), "127.0.0.1", 0)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"http://127.0.0.1:{port}/metrics", data=b"x") as response,
            ):
                return response.status, response.headers.get("Allow", ""), await response.text()
        finally:
            await runner.cleanup()

    status, allow, body = asyncio.run(asyncio.wait_for(post(), 20))
    assert status == 405 and "GET" in allow
    assert json.loads(body) == {"error": "method_not_allowed", "message": "Method Not Allowed"}


def test_admin_endpoint_over_tls(tmp_path: Path) -> None:
    pki = make_test_pki(tmp_path)
    server = server_ssl_context(TlsConfig(str(pki.server_cert), str(pki.server_key)))
    status, _, _ = get(BrokerMetrics(), ok, "/health", ssl=server, client_ssl=client_ssl_context(pki))
    assert status == 200


def test_busy_port_raises_and_cleans_up() -> None:
    async def scenario() -> None:
        app_runner, port = await start_admin_server(create_admin_app(BrokerMetrics(), ok), "127.0.0.1", 0)
        try:
            with pytest.raises(OSError):
                await start_admin_server(create_admin_app(BrokerMetrics(), ok), "127.0.0.1", port)
        finally:
            await app_runner.cleanup()

    asyncio.run(scenario())


def test_admin_config() -> None:
    assert load_dataclass(AdminHttpConfig, {}) == AdminHttpConfig(True, "127.0.0.1", DEFAULT_ADMIN_PORT)
    with pytest.raises(ConfigError, match=r"^admin\.port: must be between 0 and 65535"):
        load_dataclass(AdminHttpConfig, {"port": 70000}, "admin")


def test_uplink_status_pointed_at_the_admin_endpoint_says_so(start_broker, capsys):
    """`timestone uplink status --broker` given the admin port (/metrics, /health) instead of the offsets
    API's says which endpoint it reached, not that the broker has no uplink."""
    from broker_edge.uplink.status_cli import uplink_main

    broker = start_broker()
    admin = f"http://127.0.0.1:{broker.broker.admin_port}"
    for given in (admin, f"{admin}/metrics", f"{admin}/health/"):  # a path: it said "has no uplink"
        assert uplink_main(["status", "--broker", given]) == 1
        said = capsys.readouterr().err
        assert "has no uplink" not in said, given
        assert "admin endpoint (/metrics, /health), not its offsets API" in said, given
        assert len(said.splitlines()) == 1
