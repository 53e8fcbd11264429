"""``timestone broker --check``: the configuration and every file it names are read, the answer is said,
and nothing is bound, opened or written; what a service's ``ExecReload`` and config management run before
they hand a broker new files."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import yaml

from tests.conftest import free_port
from tests.e2e.mqtt.test_run_broker import TIMESTONE


def check(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TIMESTONE, "broker", "--check", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_a_good_configuration_is_said_ok_with_what_it_would_serve_and_nothing_is_touched(tmp_path: Path):
    port = free_port()
    data = tmp_path / "data"
    passwd = tmp_path / "passwd"
    passwd.write_text("")
    config = tmp_path / "edge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listeners": [{"name": "devices", "host": "127.0.0.1", "port": port}],
                "storage": {"directory": str(data)},
                "auth": {"password_file": str(passwd)},
            }
        )
    )
    with socket.create_server(("127.0.0.1", port)):  # taken: --check binds nothing, so it does not care
        done = check("--config", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"timestone broker: {config}: configuration OK (every file it names read): listeners devices "
        f"(tcp 127.0.0.1:{port}); data directory {data}"
    ]
    assert not data.exists(), "nothing is created"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["edge.yaml", "passwd"]


def test_a_wrong_key_or_a_file_it_names_that_does_not_read_is_status_2_naming_the_key(tmp_path: Path):
    config = tmp_path / "edge.yaml"
    config.write_text("limits:\n  max_conections: 5\n")
    done = check("--config", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert "limits.max_conections" in done.stderr and done.stdout == ""
    (tmp_path / "acl").write_text("topic readwrite #\nnot a rule at all\n")
    config.write_text(f"auth:\n  acl_file: {tmp_path / 'acl'}\n")
    done = check("--config", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert "auth.acl_file" in done.stderr, done.stderr


def test_without_a_file_the_embedded_defaults_are_checked(tmp_path: Path):
    done = check(cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("timestone broker: the embedded defaults: configuration OK")
    assert "listeners default (tcp 127.0.0.1:1883)" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_settings_whose_file_descriptors_the_process_cannot_hold_are_status_2_as_the_start_refuses_them(
    tmp_path: Path,
):
    """A start shares the process's descriptors (``ulimit -n``) among its settings first and refuses one
    that leaves none for a client: ``--check`` refuses it too, where it said the configuration was OK."""
    config = tmp_path / "edge.yaml"
    config.write_text(
        yaml.safe_dump({"storage": {"directory": str(tmp_path / "data"), "max_open_files": 1_000_000_000}})
    )
    done = check("--config", str(config), cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert "storage.max_open_files: no file descriptor left for client connections" in done.stderr
    assert "storage.max_open_files 1000000002" in done.stderr
    assert not (tmp_path / "data").exists()


def test_a_password_acl_or_tokens_file_that_a_start_refuses_is_refused_by_the_check(tmp_path: Path):
    """What the start reads in those files (a password file's lines, an ACL file's rules, the readers'
    tokens) is read by ``--check`` too: each was said OK while the start that followed exited 2."""
    data = tmp_path / "data"
    passwd, acl, tokens = tmp_path / "passwd", tmp_path / "acl.yaml", tmp_path / "tokens.yaml"
    passwd.write_text("device-1:not a hash\n")
    acl.write_text("rules:\n  - {permission: allow, action: all, topic: 'a/#', bogus: 1}\n")
    tokens.write_text("tokens:\n  - {name: spark, token: " + "s" * 32 + ", topicz: ['#']}\n")
    tokens.chmod(0o600)
    config = tmp_path / "edge.yaml"
    files = {
        "auth": {"password_file": str(passwd)},
        "acl": {"file": str(acl)},
        "offsets_api": {"tokens_file": str(tokens)},
    }
    for section, expected in [
        ("auth", f"auth.password_file: {passwd}:1: "),
        ("acl", f"{acl}, line 2: rules[0].bogus: unknown key"),
        ("offsets_api", "offsets_api.tokens_file: "),
    ]:
        document = {"storage": {"directory": str(data)}, section: files[section]}
        config.write_text(yaml.safe_dump(document))
        done = check("--config", str(config), cwd=tmp_path)
        assert done.returncode == 2, (section, done.stdout)
        assert expected in done.stderr, done.stderr
        assert done.stdout == "" and not data.exists()


def test_a_data_directory_that_is_a_file_is_status_2_naming_storage_directory_from_the_check_and_the_start(
    tmp_path: Path,
):
    """A ``storage.directory`` that names a file (or a path under one) cannot be made: the check said OK and
    the start then failed with ``[Errno 17] File exists``, naming no key; both now refuse it, naming it."""
    (tmp_path / "data").write_text("not a directory\n")
    config = tmp_path / "edge.yaml"
    for directory in (tmp_path / "data", tmp_path / "data" / "edge"):
        config.write_text(
            yaml.safe_dump(
                {
                    "listeners": [{"name": "devices", "host": "127.0.0.1", "port": 0}],
                    "storage": {"directory": str(directory)},
                    "admin_http": {"enabled": False},
                    "offsets_api": {"enabled": False},
                }
            )
        )
        done = check("--config", str(config), cwd=tmp_path)
        assert done.returncode == 2, done.stdout
        assert done.stderr.startswith("timestone broker: configuration error: storage.directory: "), (
            done.stderr
        )
        assert f"{tmp_path / 'data'} is a file, not a directory" in done.stderr, done.stderr
        started = subprocess.run(
            [*TIMESTONE, "broker", "--config", str(config)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert started.returncode == 2, started.stderr
        assert done.stderr.strip() in started.stderr and "Traceback" not in started.stderr
    assert (tmp_path / "data").read_text() == "not a directory\n"


def test_a_data_directory_that_is_a_file_is_status_2_naming_storage_directory_from_a_workers_start(
    tmp_path: Path,
):
    """``--workers`` makes its members' files under ``storage.directory``: one that names a file failed the
    command with a bare ``[Errno 17] File exists`` (status 1, no key named) where the check refused it."""
    (tmp_path / "data").write_text("not a directory\n")
    config = tmp_path / "edge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listeners": [{"name": "devices", "host": "127.0.0.1", "port": free_port()}],
                "storage": {"directory": str(tmp_path / "data")},
            }
        )
    )
    started = subprocess.run(
        [*TIMESTONE, "broker", "--workers", "2", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2, started.stderr
    said = started.stderr
    assert said.startswith("timestone broker: configuration error: storage.directory: "), said
    assert f"{tmp_path / 'data'} is a file, not a directory" in started.stderr
    assert "Errno" not in started.stderr and "Traceback" not in started.stderr
    assert (tmp_path / "data").read_text() == "not a directory\n"
