"""A server that sends MQTT 5 clients to another server with reason code 0x9C "use another server" and a
Server Reference, as a cluster member does: refusing their CONNECT (a member that lost its membership), or
accepting it and closing with a DISCONNECT at their first packet after it (a member redirecting a
publisher)."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Literal

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_5, ConnAck, Disconnect
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.reason_codes import ReasonCode


class Referrer:
    """Answers every connection's CONNECT with CONNACK 0x9C naming ``reference`` (``at="connect"``), or with
    CONNACK 0x00 and then, at the next packet, DISCONNECT 0x9C naming it (``at="publish"``); then closes."""

    def __init__(self, reference: str, at: Literal["connect", "publish"] = "connect") -> None:
        properties = Properties(reason_string="this broker is not a cluster member now")
        properties.server_reference = reference
        if at == "connect":
            self.answers = [encode(ConnAck(False, ReasonCode.USE_ANOTHER_SERVER, properties), MQTT_5)]
        else:
            accepted = encode(ConnAck(False, ReasonCode.SUCCESS, Properties()), MQTT_5)
            self.answers = [accepted, encode(Disconnect(ReasonCode.USE_ANOTHER_SERVER, properties), MQTT_5)]
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.address = ("127.0.0.1", self.port)
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn, contextlib.suppress(OSError):  # a client gone, or silent 5 s
                self.connections += 1
                conn.settimeout(5)
                for answer in self.answers:
                    conn.recv(65536)  # the CONNECT, then whatever comes next
                    conn.sendall(answer)

    def close(self) -> None:
        self.sock.close()
