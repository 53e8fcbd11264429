"""Client authentication: a password file of salted, slow hashes, and the ``timestone passwd`` command.

One line per user, ``username:$scrypt$ln=14,r=8,p=1$<salt>$<hash>`` (or ``$pbkdf2-sha512$i=N$...``): salt and
cost parameters travel in the line, so costs can be raised later without invalidating existing lines.

Cost: each verification is slow and memory-hard on purpose (docs/security.md has the measured time per
algorithm). That is far too long to run on the broker's event loop, so the broker calls ``verify_async``,
which runs the hash in a small dedicated thread pool (hashlib releases the GIL while hashing). A device that
reconnects every few seconds would still cost a hash each time, so successful verifications are remembered as
an HMAC-SHA256 of the password under a random per-process key: a later CONNECT with the same password is
checked in microseconds, on the loop. Failed verifications are never cached, so guessing costs the full hash
every time, and repeated failures from one address or for one user name are refused without a hash for a
while (``broker_edge.security.login_backoff``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import sys
import unicodedata
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from broker_edge.config import ConfigError
from broker_edge.config.loader import NUL_TEXT, decode_text, expand_home, nul_line, undecodable
from broker_edge.security.login_backoff import LoginBackoffConfig

if TYPE_CHECKING:
    import argparse

__all__ = [
    "AuthConfig",
    "PasswordFile",
    "PasswordFileError",
    "anonymous_allowed",
    "hash_password",
    "is_loopback_host",
    "passwd_main",
    "verify_hash",
]

log = logging.getLogger(__name__)

SCRYPT_LOG2_N = 14
SCRYPT_R = 8
SCRYPT_P = 1
PBKDF2_ITERATIONS = 210_000
SALT_BYTES = 16
HASH_BYTES = 32
# Bounds on parameters read from a file: a corrupt or hostile line must not make one verification take
# minutes or gigabytes.
_MAX_SCRYPT_LOG2_N = 20
_MAX_SCRYPT_R = 32
_MAX_SCRYPT_P = 16
_MAX_PBKDF2_ITERATIONS = 10_000_000
_SCRYPT_MAXMEM = 1 << 30
ALGORITHMS = ("scrypt", "pbkdf2-sha512")


@dataclass
class AuthConfig:
    """Who may connect: the password file, and whether clients without credentials are accepted."""

    password_file: str | None = None
    """Path of the password file (``timestone passwd`` writes it); unset = no password logins."""
    allow_anonymous: bool | None = None
    """Accept clients without a username; unset = only on listeners bound to loopback addresses."""
    client_id_must_match_login: bool = False
    """Refuse a client id that is not the login (username, or certificate CN); an empty one gets the login."""
    client_id_free_logins: list[str] = field(default_factory=list)
    """Logins ``client_id_must_match_login`` leaves free to pick client ids (jobs with many connections)."""
    failed_logins: LoginBackoffConfig = field(default_factory=LoginBackoffConfig)
    """Backoff after failed password logins, per client address and per user name."""

    def __post_init__(self) -> None:
        expand_home(self, "password_file")
        if self.password_file is not None and not self.password_file.strip():
            raise ConfigError("password_file", "must be a path or left out")


class PasswordFileError(ValueError):
    """The password file is missing, unreadable or malformed (``line`` is 1-based, 0 = the whole file)."""

    def __init__(self, path: str | Path, line: int, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.detail = message
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")


@functools.lru_cache(maxsize=4096)
def is_loopback_host(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable only from this machine (127.0.0.0/8, ::1, localhost).

    The wildcard addresses (``0.0.0.0``, ``::``, ``""``) are not loopback: they accept from every interface.
    Cached: every publish that creates a topic's log asks it of its client's address (parsing the address
    was a visible share of the first-time-topic path with a topic per device).
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def anonymous_allowed(allow_anonymous: bool | None, listener_host: str) -> bool:
    """The anonymous-access rule: an explicit setting wins, otherwise anonymous only on loopback listeners.

    A broker reachable over a network must not be open by accident; a broker on loopback is a development
    or sidecar setup where requiring credentials only gets in the way.
    """
    if allow_anonymous is not None:
        return allow_anonymous
    return is_loopback_host(listener_host)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_password(password: bytes | str, algorithm: str = "scrypt") -> str:
    """A new salted hash of ``password`` in the password-file format (the part after ``username:``)."""
    secret = password.encode() if isinstance(password, str) else password
    salt = secrets.token_bytes(SALT_BYTES)
    if algorithm == "scrypt":
        digest = _scrypt(secret, salt, SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P, HASH_BYTES)
        params = f"ln={SCRYPT_LOG2_N},r={SCRYPT_R},p={SCRYPT_P}"
    elif algorithm == "pbkdf2-sha512":
        digest = hashlib.pbkdf2_hmac("sha512", secret, salt, PBKDF2_ITERATIONS, HASH_BYTES)
        params = f"i={PBKDF2_ITERATIONS}"
    else:
        raise ValueError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    return f"${algorithm}${params}${_b64(salt)}${_b64(digest)}"


def _scrypt(secret: bytes, salt: bytes, log2_n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(secret, salt=salt, n=1 << log2_n, r=r, p=p, maxmem=_SCRYPT_MAXMEM, dklen=length)


@dataclass(frozen=True, slots=True)
class _ParsedHash:
    algorithm: str
    params: dict[str, int]
    salt: bytes
    digest: bytes


def _parse_hash(text: str) -> _ParsedHash:
    """Parse and bound-check one stored hash; ``ValueError`` says what is wrong."""
    parts = text.split("$")
    if len(parts) != 5 or parts[0] != "":
        raise ValueError("expected $algorithm$parameters$salt$hash")
    _, algorithm, param_text, salt_text, digest_text = parts
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    params: dict[str, int] = {}
    for item in param_text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise ValueError(f"bad parameter {item!r}")
        params[key] = int(value)
    if algorithm == "scrypt":
        if set(params) != {"ln", "r", "p"}:
            raise ValueError("scrypt needs parameters ln, r and p")
        if not (1 <= params["ln"] <= _MAX_SCRYPT_LOG2_N and 1 <= params["r"] <= _MAX_SCRYPT_R):
            raise ValueError("scrypt parameters out of range")
        if not 1 <= params["p"] <= _MAX_SCRYPT_P:
            raise ValueError("scrypt parameters out of range")
    else:
        if set(params) != {"i"} or not 1_000 <= params["i"] <= _MAX_PBKDF2_ITERATIONS:
            raise ValueError("pbkdf2-sha512 needs parameter i (iterations) between 1000 and 10000000")
    try:
        salt, digest = _unb64(salt_text), _unb64(digest_text)
    except ValueError:
        raise ValueError("salt or hash is not valid base64") from None
    if len(salt) < 8 or not 16 <= len(digest) <= 64:
        raise ValueError("salt or hash has an implausible length")
    return _ParsedHash(algorithm, params, salt, digest)


def verify_hash(stored: str, password: bytes | str) -> bool:
    """Whether ``password`` matches ``stored`` (``$algorithm$...``); a malformed ``stored`` is False."""
    try:
        parsed = _parse_hash(stored)
    except ValueError:
        return False
    return _verify_parsed(parsed, password.encode() if isinstance(password, str) else password)


def _verify_parsed(parsed: _ParsedHash, secret: bytes) -> bool:
    p = parsed.params
    if parsed.algorithm == "scrypt":
        candidate = _scrypt(secret, parsed.salt, p["ln"], p["r"], p["p"], len(parsed.digest))
    else:
        candidate = hashlib.pbkdf2_hmac("sha512", secret, parsed.salt, p["i"], len(parsed.digest))
    return hmac.compare_digest(candidate, parsed.digest)


# Verified against unknown usernames so that "no such user" costs as long as "wrong password".
_DUMMY = _ParsedHash(
    "scrypt", {"ln": SCRYPT_LOG2_N, "r": SCRYPT_R, "p": SCRYPT_P}, b"\0" * SALT_BYTES, b"\0" * HASH_BYTES
)

_executor: ThreadPoolExecutor | None = None


def _hash_executor() -> ThreadPoolExecutor:
    """Two threads: enough to overlap hashing with the loop, few enough that a storm cannot eat every core."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="timestone-auth")
    return _executor


def _check_username(username: str) -> None:
    if not username:
        raise ValueError("username must not be empty")
    if ":" in username:
        raise ValueError("username must not contain ':'")
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in username):
        # Cc holds every character str.splitlines() splits on but U+2028 and U+2029 (Zl, Zp)
        raise ValueError("username must not contain control characters or line separators")
    if "\ufeff" in username:  # files joined (cat a b), the second with its BOM: a name no client types
        raise ValueError("username must not hold a byte order mark (U+FEFF): files joined together?")
    if username.startswith("#") or username != username.strip():
        raise ValueError("username must not start with '#' or start or end with whitespace")


def _file_stamp(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


def _lines(text: str) -> list[str]:
    """The lines of a password file as ``timestone passwd`` writes them: ended by "\n" ("\r\n" tolerated).

    Never ``str.splitlines()``, which also splits on characters a line may hold (U+2028, U+0085, ...): the
    reader and the writer must agree on where a line ends. A byte order mark an editor put first (U+FEFF) is
    no part of the first line: it would be the first user name's first character, which no client types.
    """
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _parse_file(path: Path) -> tuple[dict[str, _ParsedHash], tuple[int, int, int, int]]:
    try:
        stamp = _file_stamp(path)
        text = _read_text(path)
    except FileNotFoundError:
        raise PasswordFileError(path, 0, "file not found") from None
    except OSError as exc:
        raise PasswordFileError(path, 0, f"cannot read: {exc}") from exc
    return _parse_text(path, text), stamp


def _read_text(path: Path) -> str:
    """The file's text as the configuration file's is read (UTF-8, UTF-16 or UTF-32 with a byte order mark:
    what Windows tools write); ``PasswordFileError`` naming the line of bytes that are no such text."""
    try:
        text = decode_text(path.read_bytes())
    except UnicodeDecodeError as exc:
        raise PasswordFileError(path, *undecodable(exc)) from None
    nul = nul_line(text)
    if nul is not None:
        raise PasswordFileError(path, nul, NUL_TEXT)
    return text


def _parse_text(path: Path, text: str) -> dict[str, _ParsedHash]:
    """The users of a password file's text; ``PasswordFileError`` names the first line the broker refuses."""
    entries: dict[str, _ParsedHash] = {}
    for number, line in enumerate(_lines(text), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        username, sep, stored = line.partition(":")
        if not sep:
            raise PasswordFileError(path, number, "expected username:$algorithm$parameters$salt$hash")
        try:
            _check_username(username)
            parsed = _parse_hash(stored.strip())
        except ValueError as exc:
            raise PasswordFileError(path, number, str(exc)) from None
        if username in entries:
            raise PasswordFileError(path, number, f"user {username!r} appears twice")
        entries[username] = parsed
    return entries


class PasswordFile:
    """The users and password hashes of one file, kept in memory and re-read when the file changes."""

    def __init__(self, path: str | Path, *, cache: bool = True) -> None:
        """Prefer ``PasswordFile.load(path)``; ``cache=False`` disables remembering successful checks."""
        self.path = Path(path)
        self._entries: dict[str, _ParsedHash] = {}
        self._stamp: tuple[int, int, int, int] | None = None
        self._cache_enabled = cache
        self._cache_key = secrets.token_bytes(32)
        self._cache: dict[str, tuple[_ParsedHash, bytes]] = {}

    @classmethod
    def load(cls, path: str | Path, *, cache: bool = True) -> PasswordFile:
        """Read the file; ``PasswordFileError`` names the line of any malformed entry."""
        instance = cls(path, cache=cache)
        instance._entries, instance._stamp = _parse_file(instance.path)
        instance._warn_if_readable()
        return instance

    @property
    def users(self) -> list[str]:
        """User names in file order."""
        return list(self._entries)

    def __contains__(self, username: object) -> bool:
        return username in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def reload(self) -> bool:
        """Re-read the file if it changed since the last read; True if it was re-read.

        On a broken or missing file the previous users stay in force and ``PasswordFileError`` is raised,
        so a bad edit followed by SIGHUP does not lock every device out.
        """
        try:
            if self._stamp == _file_stamp(self.path):
                return False
        except OSError:
            pass  # reported by _parse_file below
        entries, stamp = _parse_file(self.path)
        had = len(self._entries)
        self._entries, self._stamp = entries, stamp
        self._cache = {}
        self._warn_if_readable()
        if entries or not had:
            log.info("password file %s reloaded: %d users", self.path, len(entries))
        else:  # emptied (a template rendered empty, ``> passwd``): taken, as a deliberate edit, but said
            log.warning(
                "password file %s reloaded: 0 users (it had %d): every password login is refused until users "
                "are added",
                self.path,
                had,
            )
        return True

    def _warn_if_readable(self) -> None:
        try:
            mode = self.path.stat().st_mode
        except OSError:
            return
        if mode & 0o007:
            log.warning(
                "password file %s is readable by every user (mode %o); use 0600, or 0640 with the group of "
                "the broker's user",
                self.path,
                mode & 0o777,
            )

    def _cached(self, username: str, parsed: _ParsedHash, password: bytes) -> bool:
        """Whether ``password`` was verified before against this very stored hash (not a replaced one)."""
        if not self._cache_enabled:
            return False
        hit = self._cache.get(username)
        if hit is None or hit[0] is not parsed:
            return False
        digest = hmac.new(self._cache_key, password, hashlib.sha256).digest()
        return hmac.compare_digest(hit[1], digest)

    def _remember(self, username: str, parsed: _ParsedHash, password: bytes) -> None:
        if self._cache_enabled:
            digest = hmac.new(self._cache_key, password, hashlib.sha256).digest()
            self._cache[username] = (parsed, digest)

    def remembered(self, username: str, password: bytes | None) -> bool:
        """Whether ``password`` is one verified before for ``username`` (microseconds, no hash)."""
        parsed = self._entries.get(username)
        return password is not None and parsed is not None and self._cached(username, parsed, password)

    def verify(self, username: str, password: bytes | None) -> bool:
        """Whether ``username`` exists and ``password`` is theirs; blocks for one hash unless cached.

        A missing password, or an unknown user, is False (the latter after a dummy hash, so timing does
        not reveal which user names exist).
        """
        if password is None:
            return False
        parsed = self._entries.get(username)
        if parsed is None:
            _verify_parsed(_DUMMY, password)
            return False
        if self._cached(username, parsed, password):
            return True
        if _verify_parsed(parsed, password):
            self._remember(username, parsed, password)
            return True
        return False

    async def verify_async(self, username: str, password: bytes | None) -> bool:
        """``verify`` without blocking the event loop: cache hits answer at once, hashes run in a thread."""
        if password is None:
            return False
        parsed = self._entries.get(username)
        if parsed is not None and self._cached(username, parsed, password):
            return True
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_hash_executor(), self.verify, username, password)

    @staticmethod
    def set_password(
        path: str | Path,
        username: str,
        password: bytes | str,
        *,
        create: bool = False,
        algorithm: str = "scrypt",
    ) -> bool:
        """Add ``username`` or replace their hash, rewriting the file atomically (a new file gets mode 0600,
        one that exists keeps its owner, group and mode, less others' permissions).

        Returns True if the user was added, False if updated. Other lines (comments included) are kept.
        The file must exist unless ``create`` is true, so that a mistyped path does not silently start a
        new, empty user database. An edit that would leave a file the broker refuses is not made
        (``PasswordFileError`` names the line); replacing the hash of a user whose line the broker refuses
        repairs the file. Concurrent edits of one file wait for each other (``_locked``): none is lost.
        """
        _check_username(username)
        secret = password.encode() if isinstance(password, str) else password
        if not secret:
            raise ValueError("password must not be empty")
        target = Path(os.path.realpath(path))  # a link's file, locked and edited as by its own path
        new_line = f"{username}:{hash_password(secret, algorithm)}"
        with _locked(target, create):
            before = _read_lines(target, create)
            lines = list(before)
            added = True
            for i, line in enumerate(lines):
                if _line_user(line) == username:
                    lines[i] = new_line
                    added = False
                    break
            else:
                lines.append(new_line)
            _write_atomically(target, before, lines)
        return added

    @staticmethod
    def delete_user(path: str | Path, username: str) -> bool:
        """Remove ``username``; True if they were there (the file is rewritten atomically), else False."""
        target = Path(os.path.realpath(path))  # a link's file, locked and edited as by its own path
        with _locked(target, create=False):
            lines = _read_lines(target, create=False)
            kept = [line for line in lines if _line_user(line) != username]
            if len(kept) == len(lines):
                return False
            _write_atomically(target, lines, kept)
        return True


def _line_user(line: str) -> str | None:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    username, sep, _ = line.partition(":")
    return username if sep else None


def _not_found(path: Path) -> PasswordFileError:
    return PasswordFileError(path, 0, "file not found (use -c to create it)")


@contextlib.contextmanager
def _locked(path: Path, create: bool) -> Iterator[None]:
    """An exclusive lock on ``.<name>.lock`` beside the file, held while it is read, edited and replaced.

    Not a lock on the file itself: the file is replaced by a rename, and a lock on the file replaced does not
    exclude whoever opens the new one. The lock file is left in place (removing it would let two editors
    lock two different files).
    """
    import fcntl  # the passwd command's, not the broker's

    if not create and not path.exists():
        raise _not_found(path)
    if not path.parent.is_dir():
        raise PasswordFileError(path, 0, f"no directory {path.parent} (make it first)")
    if path.exists() and not path.is_file():
        raise PasswordFileError(path, 0, f"not a regular file ({_kind(path)}): name the password file itself")
    descriptor = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _kind(path: Path) -> str:
    """What ``path`` is, when it is not a regular file."""
    kinds = {path.is_dir: "a directory", path.is_fifo: "a pipe", path.is_socket: "a socket"}
    return next((name for test, name in kinds.items() if test()), "a device")


def _read_lines(path: Path, create: bool) -> list[str]:
    """The file's lines (checked by ``_write_atomically``, as the edit would leave them)."""
    try:
        text = _read_text(path)
    except FileNotFoundError:
        if create:
            return []
        raise _not_found(path) from None
    except OSError as exc:
        raise PasswordFileError(path, 0, f"cannot read: {exc}") from exc
    return _lines(text)


def _write_atomically(path: Path, before: list[str], lines: list[str]) -> None:
    """Replace the file's ``before`` lines by ``lines``: temp file in the same directory, fsync, rename, so
    readers see the old file or the new one, never half. A new file is 0600; one that exists keeps its owner,
    group and mode.

    Only a file the broker accepts whole (the parser it loads the file with) is written: an edit that would
    leave a line the broker refuses (added to a file already holding one) raises ``PasswordFileError``
    naming that line as the file holds it now, and the file stays as it was; an edit that removes or
    replaces the only such line (``--delete`` of that user, a new password for them) repairs the file."""
    from broker_edge.security.replace_files import replace_files  # the passwd command's, not the broker's

    text = _text(lines)
    try:
        _parse_text(path, text)
    except PasswordFileError:
        _parse_text(path, _text(before))  # raises naming the line as the file holds it now
        raise
    replace_files([(path, text.encode("utf-8"), 0o600)])


def _text(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def _parser() -> argparse.ArgumentParser:
    import argparse  # the passwd command's, not the broker's

    parser = argparse.ArgumentParser(
        prog="timestone passwd",
        description="Add, update or delete a user in a Timestone broker password file.",
        epilog="Exit status: 0 done, 1 error (file, user, password), 2 bad usage. The broker re-reads the "
        "file on SIGHUP.",
    )
    parser.add_argument("file", metavar="FILE", help="password file")
    parser.add_argument("username", metavar="USERNAME")
    parser.add_argument("-c", "--create", action="store_true", help="create FILE if it does not exist")
    parser.add_argument("--delete", action="store_true", help="remove USERNAME from FILE")
    parser.add_argument(
        "--password", metavar="P", help="the password (visible in the process list; default: prompt twice)"
    )
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="scrypt", help="hash (default: scrypt)")
    return parser


def passwd_main(argv: list[str], *, prompt: Callable[[str], str] | None = None) -> int:
    """``timestone passwd FILE USERNAME [--password P] [--delete] [-c]``; returns the exit status.

    ``prompt`` reads a password without echo (``getpass`` by default; tests hand in their own). Standard
    input that is no terminal (a pipe: ``echo "$PW" | timestone passwd ...``) gives it on its first line.
    """
    piped = prompt is None and sys.stdin is not None and not sys.stdin.isatty()
    if prompt is None:
        import getpass

        prompt = getpass.getpass
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage / help already
        return 0 if exc.code == 0 else 2
    if args.delete and (args.password is not None or args.create):
        parser.print_usage(sys.stderr)
        print("timestone passwd: error: --delete takes no --password or -c", file=sys.stderr)
        return 2
    try:
        if args.delete:
            if not PasswordFile.delete_user(args.file, args.username):
                return _fail(f"no user {args.username!r} in {args.file}")
            print(f"deleted user {args.username!r} from {args.file}")
            return 0
        password = args.password
        if password is None and piped:
            line = sys.stdin.readline()
            if not line:
                return _fail(
                    "no password given (standard input is no terminal: give the password on its first line, "
                    "or --password)"
                )
            password = line.removesuffix("\n").removesuffix("\r")
        elif password is None:
            password = prompt("Password: ")
            if password != prompt("Reenter password: "):
                return _fail("passwords do not match")
        if not password:
            return _fail("password must not be empty")
        added = PasswordFile.set_password(
            args.file, args.username, password, create=args.create, algorithm=args.algorithm
        )
    except PasswordFileError as exc:
        if exc.line:
            return _fail(
                f"{exc}: the broker refuses this file, so it is left as it is; correct or remove line "
                f"{exc.line} (--delete of its user removes it), then run this again"
            )
        return _fail(str(exc))
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    except (EOFError, KeyboardInterrupt):
        return _fail("no password given")
    print(f"{'added' if added else 'updated'} user {args.username!r} in {args.file}")
    return 0


def _fail(message: str) -> int:
    print(f"timestone passwd: error: {message}", file=sys.stderr)
    return 1
