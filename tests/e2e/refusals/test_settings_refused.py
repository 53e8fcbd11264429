"""Settings that would switch a bound off or name a file that is not there: ``timestone broker`` exits 2 with
one line naming the dotted key, no traceback, and nothing on disk (no data directory, no store opened)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.security.tls import no_client_ca
from broker_edge.settings.broker import BrokerConfig
from tests.tls_certs import make_test_pki, mutual_tls


def refused(tmp_path: Path, text: str, environment: dict[str, str] | None = None) -> str:
    """Run the broker on config ``text`` from ``tmp_path`` (with ``environment`` added to its environment);
    assert exit 2 and no data; return stderr."""
    config = tmp_path / "broker.yaml"
    config.write_text(text)
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config)]
    env = {**os.environ, **(environment or {})}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "timestone-data").exists()  # refused before the store was opened
    return done.stderr


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ("limits: {connect_timeout_s: .nan}", "limits.connect_timeout_s"),
        ("limits: {messages_per_second_per_client: .inf}", "limits.messages_per_second_per_client"),
        ("limits: {partial_packet_timeout_s: -.inf}", "limits.partial_packet_timeout_s"),
    ],
)
def test_nan_and_infinities_are_refused_naming_the_field(tmp_path, document, key):
    err = refused(tmp_path, document + "\nadmin_http: {port: 0}\noffsets_api: {port: 0}\n")
    assert f"configuration error: {key}: expected a finite number" in err


def test_a_missing_password_file_is_a_configuration_error(tmp_path):
    err = refused(tmp_path, f"auth: {{password_file: {tmp_path / 'passwd'}}}\n")
    assert f"auth.password_file: file not found: {tmp_path / 'passwd'}" in err


def test_a_malformed_password_file_names_its_key_and_line(tmp_path):
    (tmp_path / "passwd").write_text("device-1 has no colon\n")
    err = refused(tmp_path, f"auth: {{password_file: {tmp_path / 'passwd'}}}\n")
    assert "auth.password_file: " in err and "passwd:1" in err


def tls_listener(certfile: Path, keyfile: Path) -> str:
    listener: dict[str, Any] = {
        "name": "devices",
        "type": "tls",
        "port": 0,
        "tls": {"certfile": str(certfile), "keyfile": str(keyfile)},
    }
    return yaml.safe_dump({"listeners": [{"name": "local", "port": 0}, listener]})


def test_tls_files_are_named_by_their_dotted_key(tmp_path):
    pki = make_test_pki(tmp_path / "pki")
    err = refused(tmp_path, tls_listener(tmp_path / "gone.pem", pki.server_key))
    assert "listeners[1].tls.certfile: file not found" in err
    err = refused(tmp_path, tls_listener(pki.server_cert, tmp_path / "gone.key"))
    assert "listeners[1].tls.keyfile: file not found" in err
    err = refused(tmp_path, tls_listener(pki.client_cert, pki.server_key))  # a key of another certificate
    assert "listeners[1].tls.certfile: cannot load certificate/key" in err


def test_a_clients_certificate_on_a_tls_listener_is_refused_naming_it(tmp_path):
    """A certificate whose extended key usage has no serverAuth (a client's, a site's, as ``timestone pki``
    issues them) loaded, the broker served it, and every TLS client refused the handshake ('unsuitable
    certificate purpose'); the start and ``--check`` now refuse it naming the key."""
    pki = make_test_pki(tmp_path / "pki")
    err = refused(tmp_path, tls_listener(pki.client_cert, pki.client_key))
    assert "listeners[1].tls.certfile: " in err
    assert "its extended key usage (clientAuth) has no serverAuth" in err
    assert "timestone pki issue server" in err
    config = tmp_path / "broker.yaml"
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(config)]
    checked = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert checked.returncode == 2 and "has no serverAuth" in checked.stderr, checked.stderr
    config.write_text(tls_listener(pki.server_cert, pki.server_key))  # a server's certificate: served
    served = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert served.returncode == 0 and "configuration OK" in served.stdout, served.stderr


def test_an_acl_file_that_is_a_directory_is_named(tmp_path):
    err = refused(tmp_path, f"acl: {{file: {tmp_path}}}\n")
    assert f"acl.file: is a directory, not a file: {tmp_path}" in err


def test_settings_whose_descriptors_leave_no_room_for_a_connection_are_refused(tmp_path):
    err = refused(
        tmp_path, "storage: {max_open_files: 10000000}\nadmin_http: {port: 0}\noffsets_api: {port: 0}\n"
    )
    assert (
        "configuration error: storage.max_open_files: no file descriptor left for client connections" in err
    )
    assert "storage.max_open_files 10000002" in err


def test_the_loader_refuses_nan_wherever_a_float_is_read():
    expected = r"^sessions\.persist_interval_s: expected a finite number, got nan"
    with pytest.raises(ConfigError, match=expected):
        load_dataclass(BrokerConfig, {"sessions": {"persist_interval_s": float("nan")}})
    config = load_dataclass(BrokerConfig, {"limits": {"connect_timeout_s": 2.5}})
    assert config.limits.connect_timeout_s == 2.5


def test_the_uplinks_files_are_named_by_their_dotted_key(tmp_path):
    pki = make_test_pki(tmp_path / "pki")
    site_tls = {
        "certfile": str(pki.client_cert),
        "keyfile": str(tmp_path / "gone.key"),
        "cafile": str(pki.ca_cert),
    }
    err = refused(
        tmp_path,
        yaml.safe_dump(
            {"uplink": {"hubs": ["wss://127.0.0.1:1/v1/uplink"], "site_id": "s1", "tls": site_tls}}
        ),
    )
    assert "uplink.tls.keyfile: file not found" in err
    hub_tls = {
        "certfile": str(tmp_path / "gone.pem"),
        "keyfile": str(pki.server_key),
        "cafile": str(pki.ca_cert),
    }
    err = refused(tmp_path, yaml.safe_dump({"uplink_hub": {"port": 0, "tls": hub_tls}}))
    assert "uplink_hub.tls.certfile: file not found" in err


def test_a_ca_file_holding_only_end_certificates_is_refused_naming_it(tmp_path):
    """A listener's ``tls.cafile`` naming the server's own certificate (or a device's) loaded, ``--check``
    said OK, and every device's handshake then failed with 'unknown ca'."""
    pki = make_test_pki(tmp_path / "pki")
    tls = mutual_tls(pki, cafile=pki.server_cert)
    listener = {"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls}
    err = refused(tmp_path, yaml.safe_dump({"listeners": [listener]}))
    assert "configuration error: listeners[0].tls.cafile: holds no CA certificate, only end ones (" in err
    assert (
        "name the file of the CA that issued the clients' certificates (timestone pki: its ca.pem) in " in err
    )
    assert f"{pki.server_cert}'s place" in err
    both = tmp_path / "both.pem"  # a CA beside an end certificate: it verifies the CA's clients
    both.write_bytes(pki.server_cert.read_bytes() + pki.ca_cert.read_bytes())
    assert no_client_ca(str(both)) is None
    assert no_client_ca(str(pki.ca_cert)) is None


def test_an_mqtt_listener_on_the_admin_port_is_refused_naming_both_keys(tmp_path):
    err = refused(
        tmp_path,
        "listeners:\n  - {name: devices, host: 127.0.0.1, port: 18830}\n"
        "admin_http: {host: 0.0.0.0, port: 18830}\noffsets_api: {port: 0}\n",
    )
    assert "configuration error: admin_http.port: port 18830 on 0.0.0.0 is already listeners[0].port" in err


PORTS = "admin_http: {port: 0}\noffsets_api: {port: 0}\n"


@pytest.mark.parametrize(
    ("storage", "line"),
    [
        (
            '  persist:\n    - pattern: "a/#/b"\n      qos: [1]\n',
            "storage.persist[0].pattern: misplaced wildcard in topic filter 'a/#/b'",
        ),
        (
            '  persist:\n    - pattern: "#"\n      qos: [3]\n',
            "storage.persist[0].qos: must be within 0, 1, 2, got [3]",
        ),
        (
            '  persist:\n    - pattern: "fleet/#"\n    - pattern: "#"\n      retention_ms: -1\n',
            "storage.persist[1].retention_ms: must be >= 1 (or null: storage.retention_ms applies; to keep "
            "these topics' records without limit, make storage.retention_ms null and give the other rules "
            "theirs), got -1",
        ),
        (
            "  max_open_files: 0\n",
            "storage.max_open_files: must be at least 2 (a segment and its index), got 0",
        ),
        (
            "  max_open_files: 1\n",
            "storage.max_open_files: must be at least 2 (a segment and its index), got 1",
        ),
    ],
)
def test_what_the_store_would_refuse_at_open_is_refused_naming_the_key(tmp_path, storage, line):
    err = refused(tmp_path, f"storage:\n  directory: {tmp_path / 'data'}\n{storage}{PORTS}")
    config = tmp_path / "broker.yaml"
    assert err.splitlines()[0].startswith(
        f"timestone broker: configuration error: {line} (in {config}, line "
    )
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "storage:\n  directory: DATA\nlogging: {level: INFO}\nstorage:\n  durability: group\n",
            "storage: duplicate key: on line 1 and again on line 4",
        ),
        (
            "limits:\n  max_connections: 5\n  max_connections: 50000\n",
            "limits.max_connections: duplicate key: on line 2 and again on line 3",
        ),
        (
            "listeners:\n  - name: local\n    port: 0\n    host: 127.0.0.1\n    port: 1883\n",
            "listeners[0].port: duplicate key: on line 3 and again on line 5",
        ),
    ],
)
def test_a_key_given_twice_is_refused_naming_the_key_and_its_lines(tmp_path, text, line):
    text = text.replace("DATA", str(tmp_path / "data"))
    err = refused(tmp_path, text + PORTS)
    config = tmp_path / "broker.yaml"
    assert err.splitlines() == [f"timestone broker: configuration error: {line} (in {config})"]
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "listeners:\n\t- {name: local, port: 0}\n",
            "not valid YAML: line 2, column 1: found character '\\t' that cannot start any token "
            "(while scanning for the next token)",
        ),
        (
            "limits:\n  max_connections: [5\n",
            "not valid YAML: line 3, column 11: expected ',' or ']', but got ':' "
            "(while parsing a flow sequence)",
        ),
        (
            "limits: {max_connections: 5}\n  storage: {}\n",
            "not valid YAML: line 2, column 3: expected <block end>, but found '<block mapping start>' "
            "(while parsing a block mapping)",
        ),
        pytest.param(  # before, a RecursionError traceback
            "limits: {max_connections: " + "[" * 10_000 + "]" * 10_000 + "}\n",
            "not valid YAML: nested deeper than it can be read (lists or mappings inside each other hundreds"
            " of times)",
            id="nested_past_the_parser",
        ),
    ],
)
def test_a_file_that_is_no_yaml_is_refused_in_one_line_naming_line_and_column(tmp_path, text, line):
    err = refused(tmp_path, text + PORTS)
    config = tmp_path / "broker.yaml"
    assert err.splitlines() == [f"timestone broker: configuration error: {config}: {line}"]


def test_an_env_value_nested_past_the_parser_is_refused_in_one_line_naming_its_variable(tmp_path):
    """A file nested that deep is refused as not valid YAML; a value of ``!env NAME`` nested as deep stopped
    the start with a RecursionError traceback as YAML read the number in it."""
    deep = "[" * 10_000 + "]" * 10_000
    err = refused(
        tmp_path, "limits: {max_connections: !env TIMESTONE_DEEP}\n" + PORTS, {"TIMESTONE_DEEP": deep}
    )
    assert err.splitlines() == [
        "timestone broker: configuration error: limits.max_connections: the environment variable "
        "TIMESTONE_DEEP (!env TIMESTONE_DEEP) is not valid YAML: nested deeper than it can be read (lists or "
        f"mappings inside each other hundreds of times) (in {tmp_path / 'broker.yaml'}, line 1)"
    ]


def test_a_garbage_collector_threshold_past_what_the_interpreter_holds_is_refused(tmp_path):
    err = refused(tmp_path, "runtime: {gc_young_threshold: 100000000000000000000}\n" + PORTS)
    assert err.splitlines() == [
        "timestone broker: configuration error: runtime.gc_young_threshold: must be at most 2147483647, "
        f"got 100000000000000000000 (in {tmp_path / 'broker.yaml'}, line 1)"
    ]


def test_an_acl_file_that_is_no_utf8_text_is_refused_in_one_line(tmp_path):
    acl = tmp_path / "acl.yaml"
    acl.write_bytes(b"rules:\n  - {permission: allow, action: all, topic: caf\xe9/#}\n")
    err = refused(tmp_path, f"acl: {{file: {acl}}}\n" + PORTS)
    assert err.splitlines()[-1:] == [
        f"timestone broker: configuration error: {acl}, line 2: not UTF-8 text (byte 0xe9), nor UTF-16 or "
        "UTF-32 with a byte order mark: save it as UTF-8"
    ]


def test_a_readers_tokens_file_that_does_not_load_is_named_by_its_dotted_key(tmp_path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_bytes(b"tokens:\n  - {name: caf\xe9, token: s3cret}\n")
    tokens.chmod(0o600)
    err = refused(tmp_path, f"offsets_api: {{port: 0, tokens_file: {tokens}}}\nadmin_http: {{port: 0}}\n")
    assert err.splitlines()[-1:] == [
        f"timestone broker: configuration error: offsets_api.tokens_file: {tokens}: not UTF-8 text: 'utf-8' "
        "codec can't decode byte 0xe9 in position 22: invalid continuation byte "
        f"(in {tmp_path / 'broker.yaml'}, line 1)"
    ]
    tokens.write_text("tokens:\n  - {name: job, token: t1}\n  - {name: job, token: t2}\n")
    err = refused(tmp_path, f"offsets_api: {{port: 0, tokens_file: {tokens}}}\nadmin_http: {{port: 0}}\n")
    assert err.splitlines()[-1:] == [
        "timestone broker: configuration error: offsets_api.tokens_file: two tokens are named 'job' "
        f"(in {tmp_path / 'broker.yaml'}, line 1)"
    ]
    err = refused(tmp_path, "offsets_api: {port: 0, token: ' s3cret'}\nadmin_http: {port: 0}\n")
    assert err.splitlines() == [
        "timestone broker: configuration error: offsets_api.token: must not be empty nor start or end with "
        f"whitespace (in {tmp_path / 'broker.yaml'}, line 1)"
    ]


def test_a_passphrase_protected_key_is_refused_naming_it_without_asking_for_the_passphrase(tmp_path):
    """OpenSSL would ask for the passphrase on the terminal (a start that hangs there, or, with no terminal,
    an error naming no setting); the broker reads unencrypted keys only."""
    from cryptography.hazmat.primitives import serialization

    pki = make_test_pki(tmp_path / "pki")
    key = serialization.load_pem_private_key(pki.server_key.read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    err = refused(tmp_path, tls_listener(pki.server_cert, encrypted))
    assert err.splitlines() == [
        f"timestone broker: configuration error: listeners[1].tls.keyfile: {encrypted} is encrypted "
        "(protected by a passphrase): give an unencrypted key, readable by the broker only (mode 0600) "
        f"(in {tmp_path / 'broker.yaml'}, line 8)"
    ]


def test_a_refused_value_names_the_file_and_line_it_came_from(tmp_path):
    """An operator with several brokers' files saw ``limits.max_connections: must be >= 1`` and not which
    file said so; the line now ends with the file and the line of the key."""
    err = refused(tmp_path, "admin_http: {port: 0}\nlimits:\n  max_connections: -1\n")
    assert err == (
        "timestone broker: configuration error: limits.max_connections: must be >= 1, got -1 "
        f"(in {tmp_path / 'broker.yaml'}, line 3)\n"
    )


def test_check_names_the_file_and_line_and_an_env_value_its_variable(tmp_path):
    """``--check``, and a value written ``!env NAME``: the file, the line and the variable."""
    config = tmp_path / "broker.yaml"
    config.write_text("listeners:\n  - name: a\n  - name: b\n    port: !env TIMESTONE_TEST_PORT\n")
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(config)]
    environment = {**os.environ, "TIMESTONE_TEST_PORT": "eighteen"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 2
    assert done.stderr == (
        "timestone broker: configuration error: listeners[1].port: expected int, got str 'eighteen' "
        f"(in {config}, line 4, !env TIMESTONE_TEST_PORT)\n"
    )


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_a_file_in_utf_16_or_32_with_its_bom_loads_as_yaml_reads_it(tmp_path, encoding):
    """YAML streams may be UTF-16 or UTF-32 with a byte order mark (YAML 1.2, 5.2), which is what Windows
    PowerShell's ``>`` and Notepad's "Unicode" write; the broker refused them as 'not UTF-8 text: can't
    decode byte 0xff in position 0'."""
    config = tmp_path / "broker.yaml"
    text = "limits:\n  max_connections: 7\n"
    config.write_bytes(("\ufeff" + text).encode(encoding))  # utf-16 and utf-32 write their own BOM
    if encoding in ("utf-16", "utf-32"):
        config.write_bytes(text.encode(encoding))
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    config.write_bytes(text.replace("7", "-7").encode(encoding))
    if encoding == "utf-16-be":
        config.write_bytes(("\ufeff" + text.replace("7", "-7")).encode(encoding))
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"limits.max_connections: must be >= 1, got -7 (in {config}, line 2)" in done.stderr


def test_a_bad_value_read_from_a_fifo_is_refused_without_waiting_on_it_again(tmp_path):
    """The line of a refused key is looked up in the file again: a FIFO opened again waits for a writer, and
    the command hung instead of exiting 2."""
    import threading

    fifo = tmp_path / "broker.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=("limits: {max_connections: -1}\n",), daemon=True)
    writer.start()
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(fifo)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr == (
        "timestone broker: configuration error: limits.max_connections: must be >= 1, got -1\n"
    )
