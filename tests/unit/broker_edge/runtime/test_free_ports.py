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
