"""Ports chosen for a child process's listeners are distinct."""

from __future__ import annotations

from broker_edge.runtime.launcher import free_ports


def test_ports_chosen_together_are_distinct_and_bindable():
    """A broker process's MQTT, offsets API and admin ports are chosen together: the same port twice would
    let two of its listeners share it (SO_REUSEPORT) and split the connections to it between them."""
    import socket

    for _ in range(200):
        ports = free_ports(3)
        assert len(set(ports)) == 3
    for port in free_ports(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_ports_are_chosen_below_the_ephemeral_range():
    """A restarted broker keeps the ports of its first start: none of them may be one the kernel hands to
    outgoing connections meanwhile (``Address already in use`` on the restart)."""
    from pathlib import Path

    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [port for _ in range(50) for port in free_ports(3)]
    assert all(port < floor for port in ports)
    assert len(set(ports)) > 100
