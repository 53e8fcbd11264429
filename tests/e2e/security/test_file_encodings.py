"""The ACL file and the password file as Windows tools write them: Notepad's UTF-8 with a byte order mark,
UTF-16 LE with one (Notepad's "Unicode", PowerShell 5's ``>``), CRLF line ends. Each is read as the
configuration file is (UTF-16 and UTF-32 with a byte order mark, UTF-8 with or without one), or refused
naming the file and the line; a byte order mark is never the first rule's topic nor the first user's name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.security.auth import hash_password
from tests.e2e.security.test_acl_reload import publish_reason

ACCEPTED = 0x10  # no matching subscribers
NOT_AUTHORIZED = 0x87

RULES = "rules:\n  - {permission: allow, action: publish, topic: 'plant/#'}\n"

ENCODINGS = {
    "utf-8 with a BOM": lambda text: b"\xef\xbb\xbf" + text.encode("utf-8"),
    "utf-16 le with a BOM": lambda text: b"\xff\xfe" + text.encode("utf-16-le"),
    "utf-16 be with a BOM": lambda text: b"\xfe\xff" + text.encode("utf-16-be"),
    "utf-32 le with a BOM": lambda text: b"\xff\xfe\x00\x00" + text.encode("utf-32-le"),
}


def windows(text: str) -> str:
    return text.replace("\n", "\r\n")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_acl_and_password_files_written_by_windows_tools_are_read(tmp_path: Path, encoding: str) -> None:
    encode = ENCODINGS[encoding]
    acl = tmp_path / "acl.yaml"
    acl.write_bytes(encode(windows(RULES)))
    passwords = tmp_path / "passwd"
    passwords.write_bytes(encode(windows(f"alice:{hash_password('secret', 'pbkdf2-sha512')}\n")))
    passwords.chmod(0o600)
    with BrokerProcess(
        tmp_path / "broker",
        auth={"password_file": str(passwords)},
        acl={"file": str(acl), "default": "deny"},
    ) as broker:
        assert publish_reason(broker.port, "plant/a", "alice", "secret") == ACCEPTED
        assert publish_reason(broker.port, "other/a", "alice", "secret") == NOT_AUTHORIZED


def check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_acl_file_in_utf_16_without_a_bom_is_refused_naming_its_file_and_line(tmp_path: Path) -> None:
    acl = tmp_path / "acl.yaml"
    acl.write_bytes(RULES.encode("utf-16-le"))
    config = tmp_path / "broker.yaml"
    config.write_text(f"acl: {{file: {acl}}}\n")
    done = check(config)
    assert done.returncode == 2, done
    [said] = done.stderr.splitlines()
    assert f"{acl}, line 1" in said and "UTF-16" in said and "byte order mark" in said, said


def test_a_password_file_in_utf_16_without_a_bom_is_refused_naming_its_file_and_line(tmp_path: Path) -> None:
    passwords = tmp_path / "passwd"
    passwords.write_bytes(f"alice:{hash_password('secret', 'pbkdf2-sha512')}\n".encode("utf-16-le"))
    passwords.chmod(0o600)
    config = tmp_path / "broker.yaml"
    config.write_text(f"auth: {{password_file: {passwords}}}\n")
    done = check(config)
    assert done.returncode == 2, done
    assert f"{passwords}:1: " in done.stderr and "UTF-16" in done.stderr, done.stderr
    assert "byte order mark" in done.stderr, done.stderr


def test_bytes_that_are_no_text_are_refused_naming_the_line_they_are_on(tmp_path: Path) -> None:
    """A Latin-1 é on the second line: the refusal said only 'position 40'."""
    passwords = tmp_path / "passwd"
    passwords.write_bytes(f"alice:{hash_password('secret', 'pbkdf2-sha512')}\nren\xe9:x\n".encode("latin-1"))
    passwords.chmod(0o600)
    acl = tmp_path / "acl.yaml"
    acl.write_bytes(b"rules:\n  - {permission: allow, action: publish, topic: 'caf\xe9/#'}\n")
    config = tmp_path / "broker.yaml"
    config.write_text(f"auth: {{password_file: {passwords}}}\n")
    done = check(config)
    assert done.returncode == 2 and f"{passwords}:2: not UTF-8 text" in done.stderr, done.stderr
    config.write_text(f"acl: {{file: {acl}}}\n")
    done = check(config)
    assert done.returncode == 2 and f"{acl}, line 2: not UTF-8 text" in done.stderr, done.stderr


def test_a_byte_order_mark_inside_the_password_file_is_refused_not_made_a_user_name(tmp_path: Path) -> None:
    """Two files joined (``cat a b > passwd``), the second with a BOM: its first user was ``\\ufeffbob``,
    whom no client can name, taken silently."""
    passwords = tmp_path / "passwd"
    passwords.write_bytes(
        f"alice:{hash_password('a', 'pbkdf2-sha512')}\n".encode()
        + b"\xef\xbb\xbf"
        + f"bob:{hash_password('b', 'pbkdf2-sha512')}\n".encode()
    )
    passwords.chmod(0o600)
    config = tmp_path / "broker.yaml"
    config.write_text(f"auth: {{password_file: {passwords}}}\n")
    done = check(config)
    assert done.returncode == 2, done
    assert f"{passwords}:2: " in done.stderr and "byte order mark" in done.stderr, done.stderr
