"""SIGHUP re-reads the password file of a running broker process: a broken or missing file keeps the users
in force, saying so; a file emptied (a template rendered empty, ``> passwd``) is taken, every password login
refused from then on, and said at WARNING, where it was one INFO line like any reload."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.security.auth import hash_password
from tests.e2e.broker_clients import RawClient, wait_for

BAD_LOGIN = 0x86


def login(port: int, user: str, password: str) -> int:
    client = RawClient(port, 5)
    try:
        return client.connect(
            f"c{time.monotonic_ns()}", username=user, password=password.encode()
        ).reason_code
    finally:
        client.close()


def test_a_broken_password_file_keeps_the_users_and_an_emptied_one_is_said_at_warning(tmp_path: Path) -> None:
    passwords = tmp_path / "passwd"
    passwords.write_text(f"alice:{hash_password('a', 'pbkdf2-sha512')}\n")
    passwords.chmod(0o600)
    with BrokerProcess(tmp_path / "broker", auth={"password_file": str(passwords)}) as broker:
        assert broker.process is not None
        assert login(broker.port, "alice", "a") == 0

        def said(text: str) -> list[str]:
            return [line for line in broker.log_path.read_text().splitlines() if text in line]

        passwords.write_text("alice:not-a-hash\n")
        os.kill(broker.process.pid, signal.SIGHUP)
        assert wait_for(lambda: bool(said("not reloaded")))
        [line] = said("not reloaded")
        assert " ERROR " in line and "the previous users stay in force" in line, line
        assert f"{passwords}:1: " in line, line
        assert login(broker.port, "alice", "a") == 0

        passwords.write_text("")
        os.kill(broker.process.pid, signal.SIGHUP)
        assert wait_for(lambda: bool(said("reloaded: 0 users")))
        [line] = said("reloaded: 0 users")
        assert " WARNING " in line and "every password login is refused" in line, line
        assert login(broker.port, "alice", "a") == BAD_LOGIN
