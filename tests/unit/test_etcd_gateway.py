"""The tests' etcd gateway client (``tests/harness/etcd_gateway.py``) against a real HTTP/1.1 server on
loopback: one connection kept for a thread's requests, a connection the server closed replaced without the
caller seeing it, and failures said as ``urllib`` said them (``HTTPError``, ``OSError``)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from broker_edge.runtime.launcher import free_port
from tests.harness.etcd_gateway import GatewayConnections


class _Gateway(BaseHTTPRequestHandler):
    """Answers a POST with its path, its body and the number of the connection it came on; ``/refused``
    with 401; ``/close`` answers and closes the connection."""

    protocol_version = "HTTP/1.1"  # keep-alive, as etcd's gateway
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1
            self.number = self.server.connections

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status = 401 if self.path == "/refused" else 200
        payload = json.dumps({"path": self.path, "body": body, "connection": self.number}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        if self.path == "/close":
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0
    lock = threading.Lock()


@pytest.fixture
def gateway() -> Iterator[str]:
    server = _Server(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_threads_requests_share_one_kept_connection(gateway: str) -> None:
    connections = GatewayConnections(gateway, lambda: None)
    answers = [connections.post("/v3/kv/range", {"key": str(n)}, {}) for n in range(5)]
    assert [a["body"]["key"] for a in answers] == ["0", "1", "2", "3", "4"]
    assert {a["connection"] for a in answers} == {1}
    connections.close()


def test_another_thread_gets_a_connection_of_its_own(gateway: str) -> None:
    connections = GatewayConnections(gateway, lambda: None)
    here = connections.post("/v3/kv/range", {}, {})["connection"]
    there: list[int] = []
    thread = threading.Thread(
        target=lambda: there.append(connections.post("/v3/kv/range", {}, {})["connection"])
    )
    thread.start()
    thread.join()
    assert here != there[0]
    assert connections.post("/v3/kv/range", {}, {})["connection"] == here


def test_a_connection_the_server_closed_is_replaced_without_the_caller_seeing_it(gateway: str) -> None:
    connections = GatewayConnections(gateway, lambda: None)
    first = connections.post("/close", {}, {})
    second = connections.post("/v3/kv/range", {"key": "k"}, {})
    assert second["body"] == {"key": "k"}
    assert second["connection"] == first["connection"] + 1


def test_an_answer_that_is_not_200_is_an_http_error_and_the_connection_stays(gateway: str) -> None:
    connections = GatewayConnections(gateway, lambda: None)
    with pytest.raises(urllib.error.HTTPError) as refused:
        connections.post("/refused", {}, {})
    assert refused.value.code == 401
    assert connections.post("/v3/kv/range", {}, {})["connection"] == 1


def test_an_etcd_that_is_not_there_is_an_os_error() -> None:
    connections = GatewayConnections(f"http://127.0.0.1:{free_port()}", lambda: None)
    with pytest.raises(OSError, match="etcd at"):
        connections.post("/v3/kv/range", {}, {})


def test_an_etcd_that_answers_nothing_times_out_as_an_os_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the backlog), never answers
        connections = GatewayConnections(f"http://127.0.0.1:{silent.getsockname()[1]}", lambda: None, 0.3)
        with pytest.raises(OSError, match="timed out"):
            connections.post("/v3/kv/range", {}, {})
