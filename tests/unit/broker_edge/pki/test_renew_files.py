"""What ``timestone pki renew`` leaves on disk: a certificate and its key replaced together or not at all,
each keeping the owner, group and mode an operator gave it (a service running as its own user reads them)."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from pipelines.cli import main

SERVICE_UID = SERVICE_GID = 65534  # nobody, nogroup: the service user of these tests


def files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


def matches(cert: Path, key: Path) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    private = serialization.load_pem_private_key(key.read_bytes(), None)
    return certificate.public_key().public_bytes(*spki) == private.public_key().public_bytes(*spki)


@pytest.fixture
def issued(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate in ``certs/`` whose key is in ``keys/``: (ca, cert, key)."""
    ca = tmp_path / "ca"
    assert main(["pki", "ca", str(ca)]) == 0
    (tmp_path / "keys").mkdir()
    out = tmp_path / "certs" / "s"
    assert main(["pki", "issue", "server", "s", "--ca", str(ca), "--dns", "s.local", "--out", str(out)]) == 0
    key = tmp_path / "keys" / "s.key"
    os.replace(f"{out}.key", key)
    capsys.readouterr()
    return ca, Path(f"{out}.pem"), key


def renew(ca: Path, cert: Path, key: Path) -> int:
    return main(["pki", "renew", str(cert), "--key-file", str(key), "--ca", str(ca)])


def test_a_certificate_directory_not_writable_leaves_the_key_as_it_was(
    tmp_path: Path,
    issued: tuple[Path, Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The certificate's directory refuses new files (a read-only mount, another owner's directory) while
    the key's takes them. Refused by the file system as for an unprivileged writer: root passes a mode."""
    ca, cert, key = issued
    before = files(tmp_path)
    real_mkstemp = tempfile.mkstemp

    def mkstemp(suffix: str = "", prefix: str = "", dir: str | None = None) -> tuple[int, str]:
        if dir is not None and Path(dir) == cert.parent:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
        return real_mkstemp(suffix, prefix, dir)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    assert renew(ca, cert, key) == 1
    monkeypatch.undo()
    assert capsys.readouterr().err == (
        f"timestone pki renew: cannot write {cert} (Permission denied): nothing was replaced, {cert} and "
        f"{key} are as they were\n"
    )
    assert files(tmp_path) == before and matches(cert, key)


def test_a_failure_writing_the_certificate_leaves_the_key_as_it_was(
    tmp_path: Path,
    issued: tuple[Path, Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disk fills while the certificate is written, after the new key was."""
    ca, cert, key = issued
    before = files(tmp_path)
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        synced.append(descriptor)
        if len(synced) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    assert renew(ca, cert, key) == 1
    monkeypatch.undo()
    assert capsys.readouterr().err == (
        f"timestone pki renew: cannot write {cert} (No space left on device): nothing was replaced, {cert} "
        f"and {key} are as they were\n"
    )
    assert files(tmp_path) == before, "no new key, no temporary left behind"
    assert matches(cert, key)
    assert renew(ca, cert, key) == 0 and matches(cert, key)
    assert files(tmp_path).keys() == before.keys()


def test_renewed_files_keep_the_owner_group_and_mode_the_operator_gave_them(
    issued: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root gives a file to another user")
    ca, cert, key = issued
    os.chown(key, 0, SERVICE_GID)
    key.chmod(0o640)
    os.chown(cert, SERVICE_UID, SERVICE_GID)
    cert.chmod(0o444)
    old_key = key.read_bytes()
    assert renew(ca, cert, key) == 0
    assert f"wrote {cert} and {key} (0640)" in capsys.readouterr().out
    assert key.read_bytes() != old_key and matches(cert, key)
    assert (key.stat().st_uid, key.stat().st_gid, stat.S_IMODE(key.stat().st_mode)) == (0, SERVICE_GID, 0o640)
    assert (cert.stat().st_uid, cert.stat().st_gid, stat.S_IMODE(cert.stat().st_mode)) == (
        SERVICE_UID,
        SERVICE_GID,
        0o444,
    )


@pytest.mark.parametrize(
    ("may_give", "group", "mode"),
    [("group", SERVICE_GID, 0o640), ("nothing", os.getegid(), 0o600)],
)
def test_a_writer_that_may_not_give_the_owner_keeps_the_group_where_it_may(
    issued: tuple[Path, Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    may_give: str,
    group: int,
    mode: int,
) -> None:
    """Not root: the owner cannot be given (EPERM); the group can when the writer is in it, else the new file
    gets none of the old group's permissions."""
    if os.geteuid() != 0:
        pytest.skip("only root gives a file to another user")
    ca, cert, key = issued
    os.chown(key, SERVICE_UID, SERVICE_GID)
    key.chmod(0o640)
    real_fchown = os.fchown

    def fchown(descriptor: int, uid: int, gid: int) -> None:
        if uid != -1 or may_give == "nothing":
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        real_fchown(descriptor, uid, gid)

    monkeypatch.setattr(os, "fchown", fchown)
    assert renew(ca, cert, key) == 0
    assert (key.stat().st_uid, key.stat().st_gid, stat.S_IMODE(key.stat().st_mode)) == (0, group, mode)
    assert matches(cert, key)


@pytest.mark.parametrize("verb", ["renew", "issue --force"])
def test_a_new_key_is_never_readable_by_others_whatever_the_old_one_was(
    tmp_path: Path, issued: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    """A key left readable and writable by everyone (0666) is replaced by one others cannot read (0660): its
    owner's and group's permissions are kept, where the new key took 0644 from the old and every user of
    the machine could read it; the certificate keeps its mode but others' write."""
    ca, cert, key = issued
    key.chmod(0o666)
    cert.chmod(0o666)
    if verb == "renew":
        assert renew(ca, cert, key) == 0
    else:
        os.replace(key, cert.with_suffix(".key"))
        key = cert.with_suffix(".key")
        argv = ["pki", "issue", "server", "s", "--ca", str(ca), "--dns", "s.local", "--force"]
        assert main([*argv, "--out", str(cert.with_suffix(""))]) == 0
    assert f"({0o660:04o})" in capsys.readouterr().out
    assert stat.S_IMODE(key.stat().st_mode) == 0o660 and matches(cert, key)
    assert stat.S_IMODE(cert.stat().st_mode) == 0o664


def test_a_certificate_and_key_named_by_symbolic_links_are_replaced_where_the_links_point(
    tmp_path: Path, issued: tuple[Path, Path, Path]
) -> None:
    """``/etc/timestone/tls/server.pem`` a link to the files a deployment keeps elsewhere: the renewal
    replaced each link by a regular file, leaving the files they named (which other services and the next
    deployment use) with the old certificate, and the links gone. It replaces the files they name."""
    ca, cert, key = issued
    links = tmp_path / "links"
    links.mkdir()
    (links / "s.pem").symlink_to(cert)
    (links / "s.key").symlink_to(key)
    before = cert.read_bytes()
    assert renew(ca, links / "s.pem", links / "s.key") == 0
    assert (links / "s.pem").is_symlink() and (links / "s.key").is_symlink()
    assert cert.read_bytes() != before and matches(cert, key)


def test_a_path_that_is_not_a_regular_file_is_refused_and_left_as_it_is(
    tmp_path: Path, issued: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``issue --force --out /dev/tls`` where ``/dev/tls.key`` is a device (or a pipe): it was replaced by a
    regular file. A path that is not a regular file is refused and every file is left as it was."""
    ca, _, _ = issued
    out = tmp_path / "out" / "c"
    out.parent.mkdir()
    os.mkfifo(f"{out}.key")
    assert main(["pki", "issue", "client", "c", "--ca", str(ca), "--out", str(out), "--force"]) == 1
    assert "not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.stat(f"{out}.key").st_mode)
    assert sorted(p.name for p in out.parent.iterdir()) == ["c.key"]
