"""``timestone passwd``: the operator's way to manage the password file, driven through ``passwd_main``."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.security.auth import PasswordFile, passwd_main


class Answers:
    """A prompt that types ``replies`` in turn, recording the questions asked."""

    def __init__(self, *replies: str) -> None:
        self.queue = list(replies)
        self.asked: list[str] = []

    def __call__(self, question: str) -> str:
        self.asked.append(question)
        return self.queue.pop(0)


def test_create_then_update_then_delete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "passwd"
    assert passwd_main(["-c", str(path), "alice", "--password", "one"]) == 0
    assert "added user 'alice'" in capsys.readouterr().out
    assert passwd_main([str(path), "alice", "--password", "two"]) == 0
    assert "updated user 'alice'" in capsys.readouterr().out
    assert PasswordFile.load(path).verify("alice", b"two")

    assert passwd_main([str(path), "alice", "--delete"]) == 0
    assert "deleted user 'alice'" in capsys.readouterr().out
    assert PasswordFile.load(path).users == []


def test_prompts_twice_and_stores_the_typed_password(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    prompt = Answers("typed secret", "typed secret")
    assert passwd_main(["-c", str(path), "bob"], prompt=prompt) == 0
    assert prompt.asked == ["Password: ", "Reenter password: "]
    assert PasswordFile.load(path).verify("bob", b"typed secret")


def test_mismatched_prompts_change_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "passwd"
    assert passwd_main(["-c", str(path), "bob"], prompt=Answers("one", "two")) == 1
    assert "passwords do not match" in capsys.readouterr().err
    assert not path.exists()


def test_empty_password_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert passwd_main(["-c", str(tmp_path / "p"), "bob"], prompt=Answers("", "")) == 1
    assert "must not be empty" in capsys.readouterr().err


def test_missing_file_without_create(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert passwd_main([str(tmp_path / "passwd"), "alice", "--password", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("timestone passwd: error:")
    assert "use -c" in err


def test_delete_of_an_unknown_user(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "passwd"
    assert passwd_main(["-c", str(path), "alice", "--password", "x"]) == 0
    assert passwd_main([str(path), "mallory", "--delete"]) == 1
    assert "no user 'mallory'" in capsys.readouterr().err


def test_a_line_the_broker_refuses_is_repaired_by_its_user_s_delete_not_kept_by_an_edit(
    tmp_path: Path,
) -> None:
    """The broker refuses a file with a broken line whole: a user added beside it would not log in, so that
    edit is refused and the file left as it was; deleting the broken line's user repairs the file."""
    path = tmp_path / "passwd"
    path.write_text("alice:nonsense\n")
    assert passwd_main([str(path), "bob", "--password", "x"]) == 1
    assert path.read_text() == "alice:nonsense\n"
    assert passwd_main([str(path), "alice", "--delete"]) == 0, "a broken line can be deleted"
    assert passwd_main([str(path), "bob", "--password", "x"]) == 0
    assert PasswordFile.load(path).verify("bob", b"x")


def test_invalid_username(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert passwd_main(["-c", str(tmp_path / "p"), "a:b", "--password", "x"]) == 1
    assert "must not contain ':'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["only-file"],
        ["f", "u", "--delete", "--password", "x"],
        ["f", "u", "--delete", "-c"],
        ["f", "u", "--nope"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert passwd_main(argv) == 2
    assert "usage: timestone passwd" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert passwd_main(["--help"]) == 0
    assert "--delete" in capsys.readouterr().out


def test_pbkdf2_algorithm_option(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    assert passwd_main(["-c", str(path), "alice", "--password", "x", "--algorithm", "pbkdf2-sha512"]) == 0
    assert ":$pbkdf2-sha512$i=210000$" in path.read_text()
    assert PasswordFile.load(path).verify("alice", b"x")


def test_a_password_file_named_by_a_symbolic_link_is_edited_where_the_link_points(tmp_path: Path) -> None:
    """``/etc/timestone/passwd`` a link to the file a deployment keeps elsewhere: the edit replaced the link
    by a regular file, the file it named (the one the next deployment or another broker reads) unchanged
    and the link gone. The file it names is edited, and the link stays."""
    real = tmp_path / "secrets" / "passwd"
    real.parent.mkdir()
    assert passwd_main(["-c", str(real), "alice", "--password", "one"]) == 0
    link = tmp_path / "passwd"
    link.symlink_to(real)
    assert passwd_main([str(link), "bob", "--password", "two"]) == 0
    assert link.is_symlink()
    assert PasswordFile.load(real).verify("bob", b"two")
    assert passwd_main([str(link), "alice", "--delete"]) == 0
    assert link.is_symlink() and PasswordFile.load(real).users == ["bob"]
