"""``timestone uplink status`` against what is not a broker's offsets API: one line and a status, never a
traceback (the answers of real brokers are in tests/e2e/uplink/test_uplink.py)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from broker_edge.uplink.status_cli import uplink_main


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every GET 200 with the body its path names (a web server's page, JSON of another shape)."""

    bodies = {
        "/page/v1/uplink/sites": b"<html>sign in</html>",
        "/list/v1/uplink/sites": b"[1, 2]",
        "/site/v1/uplink/sites": b'{"role": "site", "site": {"site": "s1"}}',
        "/new-hub/v1/uplink/sites": b'{"role": "hub", "sites": []}',
    }

    def do_GET(self) -> None:
        body = self.bodies.get(self.path, b"{}")
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stranger() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/page", "answered something that is not JSON: is it a broker's offsets API?"),
        ("/list", "the answer is not an uplink status (AttributeError"),
        ("/site", "the answer is not an uplink status (KeyError: 'sent_records')"),
    ],
)
def test_an_answer_that_is_no_uplink_status_is_one_line_and_status_1(stranger, path, said, capsys):
    assert uplink_main(["status", "--broker", stranger + path]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("timestone uplink: ") and said in out.err, out.err
    assert len(out.err.splitlines()) == 1


@pytest.mark.parametrize(
    "broker", ["not-a-url", "ftp://127.0.0.1/", "127.0.0.1:9884", "http://[::1", "http://"]
)
def test_a_broker_that_is_no_http_url_is_a_wrong_command_line(broker, capsys):
    with pytest.raises(SystemExit) as exited:
        uplink_main(["status", "--broker", broker])
    assert exited.value.code == 2
    assert "an http:// or https:// URL of the broker's offsets API" in capsys.readouterr().err


def test_a_hub_no_site_has_reached_yet_is_a_table_of_no_rows(stranger, capsys):
    """A new hub, before its first site connects, answers no sites: the command said 'the answer is not an
    uplink status (TypeError: 'int' object is not iterable)', exit 1, as if it were not a hub."""
    assert uplink_main(["status", "--broker", stranger + "/new-hub"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0] == "hub: 0 site(s)"
        and lines[1].split()
        == ["site", "connected", "last", "contact", "lag", "records", "lag", "s", "records", "bytes", "gaps"]
        and len(lines) == 2
    )


class _Hub(_Answers):
    bodies = {"/v1/uplink/sites": b'{"role": "hub", "sites": []}'}


@pytest.fixture
def https_hub(tmp_path) -> Iterator[tuple[str, str]]:
    """An HTTPS server answering ``/v1/uplink/sites`` as a hub with no sites, its certificate from a CA of
    our own (as ``timestone pki`` makes for a hub's offsets API): its URL and the CA's file."""
    import ssl

    from broker_edge.runtime.local_pki import LocalPki

    pki = LocalPki(tmp_path / "pki", name="hub-ca")
    issued = pki.server("hub")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(issued.cert), str(issued.key))
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hub)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", str(pki.ca.cert)
    finally:
        server.shutdown()
        server.server_close()


def test_a_hubs_https_offsets_api_is_read_with_the_ca_of_its_certificate(https_hub, tmp_path, capsys):
    """A hub's offsets API serves HTTPS with a certificate of the operator's CA (docs/operations.md): the
    command had no option to trust that CA and said 'cannot reach URL: <urlopen error [SSL:
    CERTIFICATE_VERIFY_FAILED] ...>'. --cafile trusts it; without it the command says the certificate is
    not trusted and names the options; a CA file that does not load is a wrong command line."""
    url, ca = https_hub
    assert uplink_main(["status", "--broker", url, "--cafile", ca]) == 0
    assert capsys.readouterr().out.startswith("hub: 0 site(s)")

    assert uplink_main(["status", "--broker", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"timestone uplink: {url}: its certificate is not trusted: ")
    assert err.rstrip().endswith("(see --cafile, --certfile, --keyfile)")

    not_pem = tmp_path / "not.pem"
    not_pem.write_text("no certificate\n")
    with pytest.raises(SystemExit) as done:
        uplink_main(["status", "--broker", url, "--cafile", str(not_pem)])
    assert done.value.code == 2
    assert "--cafile: cannot load CA certificates from" in capsys.readouterr().err
