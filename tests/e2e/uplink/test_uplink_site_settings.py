"""A site's uplink addresses written by hand with a mistake are refused at start (``timestone broker`` exits 2
naming the key, before it opens its store): a proxy with no scheme or one that is no HTTP proxy, a hub port
no TCP port is. Where the broker started and its link said at every dial only the proxy's own address
("uplink to wss://...: 127.0.0.1:3128"), or tried a SOCKS proxy as if it spoke HTTP."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.uplink.uplink_harness import pki_in

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"proxy": "127.0.0.1:3128"}, "uplink.proxy: expected http://host:port, got '127.0.0.1:3128'"),
        ({"proxy": "socks5://127.0.0.1:1080"}, "uplink.proxy: expected http://host:port"),
        ({"hubs": ["wss://hub.example.com:99999/v1/uplink"]}, "uplink.hubs[0]: port out of range"),
    ],
)
def test_a_site_address_written_with_a_mistake_is_refused_at_start_naming_its_key(
    tmp_path: Path, change: dict[str, object], expected: str
) -> None:
    pki = pki_in(tmp_path / "pki")
    site = pki.site("plant-s")
    uplink = {
        "hubs": ["wss://127.0.0.1:1/v1/uplink"],
        "site_id": "plant-s",
        "tls": {"certfile": str(site.cert), "keyfile": str(site.key), "cafile": str(pki.ca.cert)},
        **change,
    }
    config = tmp_path / "broker.yaml"
    config.write_text(
        yaml.safe_dump({"uplink": uplink, "admin_http": {"port": 0}, "offsets_api": {"port": 0}})
    )
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=15, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"configuration error: {expected}" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "timestone-data").exists()
