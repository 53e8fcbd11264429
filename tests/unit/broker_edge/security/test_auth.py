"""The password file: hashing round trips, tampering, reloads, atomic writes and anonymous-access rules."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.security.auth import (
    AuthConfig,
    PasswordFile,
    PasswordFileError,
    anonymous_allowed,
    hash_password,
    is_loopback_host,
    verify_hash,
)


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    PasswordFile.set_password(path, "alice", "wonderland", create=True)
    PasswordFile.set_password(path, "bob", b"\x00binary\xffsecret")
    return path


@pytest.mark.parametrize("algorithm", ["scrypt", "pbkdf2-sha512"])
def test_hash_round_trip_for_each_algorithm(algorithm: str) -> None:
    stored = hash_password(b"s3cret", algorithm)
    assert stored.startswith(f"${algorithm}$")
    assert verify_hash(stored, b"s3cret")
    assert verify_hash(stored, "s3cret")
    assert not verify_hash(stored, b"s3cret ")
    assert hash_password(b"s3cret", algorithm) != stored, "each hash has its own salt"


def test_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown algorithm"):
        hash_password(b"x", "md5")
    assert not verify_hash("$md5$i=1$AAAA$AAAA", b"x")


def test_verify_known_and_unknown_users(users_file: Path) -> None:
    passwords = PasswordFile.load(users_file)
    assert passwords.users == ["alice", "bob"]
    assert passwords.verify("alice", b"wonderland")
    assert passwords.verify("bob", b"\x00binary\xffsecret")
    assert not passwords.verify("alice", b"Wonderland")
    assert not passwords.verify("alice", None)
    assert not passwords.verify("carol", b"wonderland")
    assert not passwords.verify("bob", b"wonderland"), "passwords are per user"


def test_line_format_carries_algorithm_parameters_and_salt(users_file: Path) -> None:
    lines = users_file.read_text().splitlines()
    assert len(lines) == 2
    username, _, stored = lines[0].partition(":")
    assert username == "alice"
    algorithm, params, salt, digest = stored.split("$")[1:]
    assert (algorithm, params) == ("scrypt", "ln=14,r=8,p=1")
    assert salt and digest and "wonderland" not in lines[0]


def test_tampered_hash_fails_verification(users_file: Path) -> None:
    text = users_file.read_text()
    alice = text.splitlines()[0]
    digest = alice.rsplit("$", 1)[1]
    flipped = ("B" if digest[0] == "A" else "A") + digest[1:]
    users_file.write_text(text.replace(alice, alice.rsplit("$", 1)[0] + "$" + flipped))
    passwords = PasswordFile.load(users_file)
    assert not passwords.verify("alice", b"wonderland")
    assert passwords.verify("bob", b"\x00binary\xffsecret")


def test_tampered_parameters_fail_verification(users_file: Path) -> None:
    users_file.write_text(users_file.read_text().replace("ln=14,r=8,p=1", "ln=13,r=8,p=1", 1))
    assert not PasswordFile.load(users_file).verify("alice", b"wonderland")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("alice", "expected username:"),
        ("alice:$scrypt$ln=14,r=8$AAAAAAAAAAA$" + "A" * 43, "ln, r and p"),
        ("alice:$scrypt$ln=40,r=8,p=1$AAAAAAAAAAA$" + "A" * 43, "out of range"),
        ("alice:$sha1$i=5$AAAA$AAAA", "unknown algorithm"),
        ("alice:$scrypt$ln=14,r=8,p=1$not*base64$" + "A" * 43, "base64"),
        ("alice:plaintext", "expected \\$algorithm"),
    ],
)
def test_malformed_line_is_reported_with_its_line_number(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "passwd"
    path.write_text(f"# users\n\n{line}\n")
    with pytest.raises(PasswordFileError, match=message) as raised:
        PasswordFile.load(path)
    assert raised.value.line == 3
    assert str(raised.value).startswith(f"{path}:3:")


def test_duplicate_user_is_an_error(users_file: Path) -> None:
    first = users_file.read_text().splitlines()[0]
    users_file.write_text(users_file.read_text() + first + "\n")
    with pytest.raises(PasswordFileError, match="appears twice"):
        PasswordFile.load(users_file)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PasswordFileError, match="file not found"):
        PasswordFile.load(tmp_path / "nope")


def test_set_password_keeps_the_files_mode_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text("# managed by timestone passwd\n")
    path.chmod(0o640)
    assert PasswordFile.set_password(path, "alice", "one") is True
    assert PasswordFile.set_password(path, "alice", "two") is False
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    lines = path.read_text().splitlines()
    assert lines[0] == "# managed by timestone passwd"
    assert len(lines) == 2
    passwords = PasswordFile.load(path)
    assert passwords.verify("alice", b"two")
    assert not passwords.verify("alice", b"one")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".passwd.lock", "passwd"], "no temporary left"


def test_a_new_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    PasswordFile.set_password(tmp_path / "passwd", "alice", "one", create=True)
    assert stat.S_IMODE((tmp_path / "passwd").stat().st_mode) == 0o600


def test_set_password_needs_create_for_a_new_file(tmp_path: Path) -> None:
    with pytest.raises(PasswordFileError, match="use -c"):
        PasswordFile.set_password(tmp_path / "passwd", "alice", "x")
    assert not (tmp_path / "passwd").exists()


@pytest.mark.parametrize(
    "username", ["", "a:b", "#admin", " alice", "al\nice", "dev\u2028x", "dev\u2029x", "dev\x85x", "dev\x9bx"]
)
def test_invalid_usernames_are_refused(tmp_path: Path, username: str) -> None:
    with pytest.raises(ValueError, match="username"):
        PasswordFile.set_password(tmp_path / "passwd", username, "x", create=True)


def test_empty_password_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="password must not be empty"):
        PasswordFile.set_password(tmp_path / "passwd", "alice", b"", create=True)


def test_delete_user(users_file: Path) -> None:
    assert PasswordFile.delete_user(users_file, "alice") is True
    assert PasswordFile.delete_user(users_file, "alice") is False
    passwords = PasswordFile.load(users_file)
    assert passwords.users == ["bob"]
    assert not passwords.verify("alice", b"wonderland")


def test_reload_sees_changes_and_only_when_the_file_changed(users_file: Path) -> None:
    passwords = PasswordFile.load(users_file)
    assert passwords.reload() is False
    PasswordFile.set_password(users_file, "carol", "c")
    PasswordFile.set_password(users_file, "alice", "new")
    assert passwords.reload() is True
    assert passwords.verify("carol", b"c")
    assert passwords.verify("alice", b"new")
    assert not passwords.verify("alice", b"wonderland")


def test_reload_of_a_broken_file_keeps_the_previous_users(users_file: Path) -> None:
    passwords = PasswordFile.load(users_file)
    users_file.write_text("garbage line\n")
    with pytest.raises(PasswordFileError, match=":1:"):
        passwords.reload()
    assert passwords.verify("alice", b"wonderland")
    os.unlink(users_file)
    with pytest.raises(PasswordFileError, match="file not found"):
        passwords.reload()
    assert passwords.verify("alice", b"wonderland")


def test_cached_success_does_not_survive_a_password_change(users_file: Path) -> None:
    passwords = PasswordFile.load(users_file)
    assert passwords.verify("alice", b"wonderland")
    assert passwords.verify("alice", b"wonderland"), "second check answers from the cache"
    assert not passwords.verify("alice", b"wonderland!"), "the cache never accepts another password"
    PasswordFile.set_password(users_file, "alice", "changed")
    passwords.reload()
    assert not passwords.verify("alice", b"wonderland")


def test_verify_async_matches_verify(users_file: Path) -> None:
    passwords = PasswordFile.load(users_file, cache=False)

    async def checks() -> list[bool]:
        return list(
            await asyncio.gather(
                passwords.verify_async("alice", b"wonderland"),
                passwords.verify_async("alice", b"wrong"),
                passwords.verify_async("nobody", b"wonderland"),
                passwords.verify_async("bob", None),
            )
        )

    assert asyncio.run(checks()) == [True, False, False, False]


def test_verify_async_answers_cache_hits_on_the_loop(users_file: Path) -> None:
    passwords = PasswordFile.load(users_file)
    assert passwords.verify("alice", b"wonderland")

    async def check() -> bool:
        return await passwords.verify_async("alice", b"wonderland")

    assert asyncio.run(check()) is True


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.53", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
        ("broker.example", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
    assert anonymous_allowed(None, host) is loopback
    assert anonymous_allowed(True, host) is True
    assert anonymous_allowed(False, host) is False


def test_auth_config_from_yaml_mapping() -> None:
    config = load_dataclass(AuthConfig, {"password_file": "/etc/timestone/passwd", "allow_anonymous": True})
    assert config == AuthConfig("/etc/timestone/passwd", True)
    assert load_dataclass(AuthConfig, None) == AuthConfig()
    with pytest.raises(ConfigError, match=r"^auth\.password_file: must be a path"):
        load_dataclass(AuthConfig, {"password_file": " "}, "auth")
