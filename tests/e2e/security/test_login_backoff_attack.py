"""Password guessing against a real broker: 30 parallel guessers are slowed to a trickle of hashed guesses,
while users keep logging in (no lock-out of a user by guessing its name, no queue behind the guesses).

Guessers connect from other loopback addresses (127.0.0.2, 127.0.0.3, ...) than the users (127.0.0.1), as
they would from other hosts.
"""

from __future__ import annotations

import threading
import time

import pytest

from broker_edge.security.auth import PasswordFile
from tests.e2e.broker_clients import raw_client_from

THRESHOLD = 5


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "passwd"
    PasswordFile.set_password(path, "alice", "correct horse", create=True)
    PasswordFile.set_password(path, "bob", "battery staple")
    return str(path)


def secured(start_broker, password_file):
    return start_broker(
        listeners=[{"name": "tcp", "host": "127.0.0.1", "port": 0, "allow_anonymous": False}],
        auth={"password_file": password_file, "failed_logins": {"threshold": THRESHOLD}},
        limits={"new_connections_per_second": 0},  # only the login backoff answers "retry later" here
    )


def login(port: int, username: str, password: bytes, source: str = "127.0.0.1", version: int = 5) -> int:
    client = raw_client_from(port, source, version)
    try:
        connack = client.connect(f"c-{username}-{time.monotonic_ns()}", username=username, password=password)
        return connack.reason_code
    finally:
        client.close()


def guess_in_parallel(port: int, username: str, sources: list[str], seconds: float) -> list[int]:
    codes: list[int] = []
    stop = time.monotonic() + seconds

    def guesser(n: int) -> None:
        while time.monotonic() < stop:
            codes.append(login(port, username, f"guess-{n}-{len(codes)}".encode(), sources[n % len(sources)]))

    threads = [threading.Thread(target=guesser, args=(n,)) for n in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return codes


def test_thirty_parallel_guessers_get_a_few_hashed_guesses_and_users_still_log_in(
    start_broker, password_file
):
    broker = secured(start_broker, password_file)
    assert login(broker.port, "alice", b"correct horse") == 0  # alice's device, before the attack
    results: dict[str, int] = {}

    def users_during_the_attack() -> None:
        time.sleep(0.5)
        results["alice"] = login(broker.port, "alice", b"correct horse")
        results["bob"] = login(broker.port, "bob", b"battery staple", version=4)  # never logged in before

    users = threading.Thread(target=users_during_the_attack)
    users.start()
    codes = guess_in_parallel(broker.port, "alice", ["127.0.0.2"], seconds=2.5)
    users.join()

    assert results == {"alice": 0, "bob": 0}
    hashed = broker.refused("bad_credentials")
    assert set(codes) == {0x86, 0x9F} and len(codes) > 100  # wrong password, or "retry later" at once
    assert hashed <= THRESHOLD + 2  # then one per backoff: 1 s, 2 s
    assert codes.count(0x9F) == broker.refused("login_backoff") == len(codes) - hashed


def test_guessing_a_user_name_from_many_addresses_does_not_lock_its_owner_out(start_broker, password_file):
    broker = secured(start_broker, password_file)
    assert login(broker.port, "alice", b"correct horse") == 0
    sources = [f"127.0.0.{n}" for n in range(10, 40)]  # 30 addresses, one guesser each: under their threshold
    codes = guess_in_parallel(broker.port, "alice", sources, seconds=1.5)
    assert codes.count(0x86) <= THRESHOLD + 1  # the user name's own backoff
    assert codes.count(0x9F) > 0
    assert login(broker.port, "alice", b"correct horse") == 0  # from where alice logs in
    assert login(broker.port, "alice", b"correct horse", source="127.0.0.77") == 0  # a known password
    assert login(broker.port, "bob", b"battery staple", source="127.0.0.12") == 0  # another user
