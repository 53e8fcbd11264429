"""Loopback helpers: a free port, and a blocking MQTT handshake to tell that a broker accepts clients."""

from __future__ import annotations

import socket
import time

from bench import frames

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def mqtt_handshake(port: int, timeout: float = 1.0) -> bool:
    """Connect, send CONNECT, expect a successful CONNACK, then DISCONNECT. True if all of that worked."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            sock.sendall(frames.connect(f"bench-probe-{time.monotonic_ns()}"))
            reply = b""
            deadline = time.monotonic() + timeout
            while len(reply) < 4 and time.monotonic() < deadline:
                chunk = sock.recv(4 - len(reply))
                if not chunk:
                    return False
                reply += chunk
            ok = len(reply) == 4 and reply[0] == frames.CONNACK and reply[3] == 0
            if ok:
                sock.sendall(frames.DISCONNECT_FRAME)
            return ok
    except OSError:
        return False
