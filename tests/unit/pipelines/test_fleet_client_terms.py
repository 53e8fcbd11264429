"""The fleet client's reading of what a broker said: Server References and why a connection attempt failed."""

from __future__ import annotations

import pytest

from pipelines.fleet.client import ConnectionRefused, connect_failure, server_address


@pytest.mark.parametrize(
    ("reference", "address"),
    [
        ("127.0.0.1:1883", ("127.0.0.1", 1883)),
        ("[fe80::9610:3eff:fe1c]:1883", ("fe80::9610:3eff:fe1c", 1883)),
        ("10.10.151.22:8883 [fe80::9610:3eff:fe1c]:1883", ("10.10.151.22", 8883)),  # the first of a list
        ("myserver.xyz.org", None),  # no port: the client cannot tell where to connect
        ("myserver.xyz.org:mqtt", None),
        ("", None),
        ("   ", None),
    ],
)
def test_the_first_host_and_port_of_a_server_reference_mqtt_4_11(reference, address):
    assert server_address(reference) == address


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ConnectionRefused(0x88), "refused_0x88"),
        (TimeoutError(), "timed_out"),
        (ConnectionRefusedError(111, "Connection refused"), "unreachable"),
        (ConnectionResetError("connection closed"), "closed"),
        (OSError(99, "Cannot assign requested address"), "OSError"),
    ],
)
def test_each_failed_connection_attempt_is_counted_by_its_cause(error, kind):
    assert connect_failure(error) == kind
