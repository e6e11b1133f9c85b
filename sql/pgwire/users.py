"""The users file of ``topicbase serve``: who may log in, by password verifier.

Location: ``--users-file FILE``, by default ``<data-dir>/users.json`` (next to the store;
``topicbase check`` ignores it). ``topicbase user add NAME`` creates or updates it; the
server re-reads it when it changes, so users added while it runs can log in at once.

Format (JSON, UTF-8)::

    {"format": "topicbase-users-1",
     "users": {"alice": {"scram": "SCRAM-SHA-256$4096:<salt>$<StoredKey>:<ServerKey>",
                         "md5": "md5<32 hex digits>", "superuser": true,
                         "connection_limit": 10}}}

``scram`` is PostgreSQL's ``pg_authid.rolpassword`` format (RFC 5802/7677 verifier,
base64 fields) and is always present. ``md5`` is PostgreSQL's ``md5`` + md5(password +
user name) and is present only when the user was added with ``--md5``; it is
password-equivalent for md5 authentication, so it is written only on request. No
plaintext password is ever stored. ``superuser`` (PostgreSQL's ``rolsuper``) is written
only when true; a record without it (files written before the flag existed) is an ordinary
user. ``connection_limit`` (PostgreSQL's ``rolconnlimit``) is the most sessions the user may
hold at once, written only when set; it does not bind a superuser.

Invariants: the file is replaced whole (temp file with mode 0600, fsync, rename, fsync of
the directory), under an exclusive ``flock`` of ``<file>.lock`` so two concurrent
``user add`` do not lose each other's update; readers never see a partial file. This
module does its own file I/O (not ``storage.fs``): the users file belongs to the front,
must be 0600 from the moment it exists, and the storage layer knows nothing of SQL users.

Thread-safety: ``UsersFile`` guards its cache with a lock; ``add_user`` is safe across
processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from sql.pgwire.verifiers import ScramVerifier, make_md5_verifier, make_scram_verifier
from storage.errors import InvalidNameError, InvalidParameterValueError, TopicbaseError
from storage.limits import (
    CONNECTION_LIMIT_MAX,
    PASSWORD_BYTES_MAX,
    USER_NAME_BYTES_MAX,
    USERS_FILE_BYTES_MAX,
)

log = logging.getLogger(__name__)

USERS_FILE_NAME = "users.json"
FORMAT = "topicbase-users-1"
FILE_MODE = 0o600
_MD5_VERIFIER = re.compile(r"md5[0-9a-f]{32}")


class ConfigFileError(TopicbaseError):
    """A users, certificate or key file that is missing, unreadable or malformed (F0000)."""

    sqlstate = "F0000"


class InvalidUserNameError(InvalidNameError):
    """A user name the users file cannot hold (42602, invalid_name)."""


class InvalidPasswordValueError(InvalidParameterValueError):
    """An empty or otherwise unusable password (22023)."""


@dataclass(frozen=True)
class UserEntry:
    """One user's verifiers, role flag and connection limit; ``scram`` is always set, ``md5``
    only if asked for; ``connection_limit`` None means no limit of the user's own."""

    name: str
    scram: str
    md5: str | None = None
    superuser: bool = False
    connection_limit: int | None = None


def default_users_path(data_dir: str) -> str:
    return os.path.join(data_dir, USERS_FILE_NAME)


def check_user_name(name: str) -> None:
    """Raise InvalidUserNameError unless ``name`` can be a startup-packet user name."""
    if not name:
        raise InvalidUserNameError("user name must not be empty")
    if any(ord(character) < 32 or ord(character) == 127 for character in name):
        raise InvalidUserNameError("user name must not contain control characters")
    if len(name.encode("utf-8")) > USER_NAME_BYTES_MAX:
        raise InvalidUserNameError(f"user name is longer than {USER_NAME_BYTES_MAX} bytes")


def check_connection_limit(limit: int | None) -> None:
    """Raise InvalidParameterValueError (22023) unless ``limit`` is None or a count of
    sessions from 0 (nobody may log in as the user) to ``CONNECTION_LIMIT_MAX``."""
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidParameterValueError(f"connection limit must be an integer, not {limit!r}")
    if not 0 <= limit <= CONNECTION_LIMIT_MAX:
        raise InvalidParameterValueError(
            f"connection limit must be from 0 to {CONNECTION_LIMIT_MAX}, not {limit}"
        )


def check_password(password: str) -> None:
    if not password:
        raise InvalidPasswordValueError("empty password")
    if "\0" in password:
        raise InvalidPasswordValueError("password must not contain a NUL character")
    if len(password.encode("utf-8")) > PASSWORD_BYTES_MAX:
        raise InvalidPasswordValueError(f"password is longer than {PASSWORD_BYTES_MAX} bytes")


# -- reading ----------------------------------------------------------------------------------
def parse_users(data: bytes, path: str) -> dict[str, UserEntry]:
    """The users of a users file's bytes; ConfigFileError naming ``path`` if malformed."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError, JSONDecodeError, depth
        raise ConfigFileError(f"users file {path} is not valid JSON: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ConfigFileError(f'users file {path} is not in format "{FORMAT}"')
    users = document.get("users")
    if not isinstance(users, dict):
        raise ConfigFileError(f'users file {path} has no "users" object')
    entries: dict[str, UserEntry] = {}
    for name, fields in users.items():
        if not isinstance(fields, dict) or not isinstance(fields.get("scram"), str):
            raise ConfigFileError(f'users file {path}: user "{name}" has no SCRAM verifier')
        md5 = fields.get("md5")
        if md5 is not None and (not isinstance(md5, str) or not _MD5_VERIFIER.fullmatch(md5)):
            raise ConfigFileError(f'users file {path}: user "{name}" has a malformed md5 hash')
        superuser = fields.get("superuser", False)
        if not isinstance(superuser, bool):
            raise ConfigFileError(f'users file {path}: user "{name}": superuser is not a boolean')
        connection_limit = fields.get("connection_limit")
        try:
            check_user_name(name)
            ScramVerifier.parse(fields["scram"])
            check_connection_limit(connection_limit)
        except (InvalidUserNameError, InvalidParameterValueError, ValueError) as error:
            raise ConfigFileError(f'users file {path}: user "{name}": {error}') from None
        entries[name] = UserEntry(name, fields["scram"], md5, superuser, connection_limit)
    return entries


def read_users(path: str) -> dict[str, UserEntry]:
    """The users in ``path``; an empty dict if the file does not exist."""
    try:
        data = _read_bytes(path)
    except FileNotFoundError:
        return {}
    return parse_users(data, path)


def _read_bytes(path: str) -> bytes:
    """The file's bytes: a regular file only (a FIFO or a device is refused without
    blocking: O_NONBLOCK), FileNotFoundError if there is none, ConfigFileError for any
    other failure."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise ConfigFileError(f"cannot read users file {path}: {error.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigFileError(f"users file {path} is not a regular file")
        return _read_all(fd, path)
    except OSError as error:  # EISDIR, EIO …
        raise ConfigFileError(f"cannot read users file {path}: {error.strerror}") from None
    finally:
        os.close(fd)


def _read_all(fd: int, path: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > USERS_FILE_BYTES_MAX:
            raise ConfigFileError(f"users file {path} is larger than {USERS_FILE_BYTES_MAX} bytes")
    return b"".join(chunks)


class UsersFile:
    """The users file as the server sees it: re-read when its size, mtime or inode change.

    A file that becomes malformed while the server runs keeps the last good contents (and
    the error is returned by ``reload`` for logging), so a bad edit never locks everyone out
    nor lets anyone in. ``generation`` grows by one each time a reload takes new contents:
    a session compares it with the one its identity was derived from (one attribute read)
    and derives it again when it moved (``sql.pgwire.connection.connection``), so a user
    demoted or removed in the file is demoted or ended in the sessions already open; the
    server reloads the file every ``USERS_FILE_POLL_S`` for that (``UsersWatch``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._users: dict[str, UserEntry] = {}
        self.generation = 0
        self._reloading = threading.Lock()  # one ``reload`` at a time
        # the stamp of the last unusable file and its error (not read again while unchanged)
        self._unusable: tuple[tuple[int, int, int], ConfigFileError] | None = None

    def lookup(self, name: str) -> UserEntry | None:
        """The user as of the last ``reload`` (callers reload first)."""
        with self._lock:
            return self._users.get(name)

    def count(self) -> int:
        with self._lock:
            return len(self._users)

    def is_superuser(self, name: str) -> bool:
        """Whether ``name`` is a superuser as of the last ``reload``; False if unknown."""
        with self._lock:
            entry = self._users.get(name)
        return entry is not None and entry.superuser

    def connection_limit(self, name: str) -> int | None:
        """The user's own connection limit as of the last ``reload`` (None: none, or
        unknown), for ``pg_roles.rolconnlimit``."""
        with self._lock:
            entry = self._users.get(name)
        return None if entry is None else entry.connection_limit

    def entries(self) -> list[UserEntry]:
        """Every user as of the last ``reload``, by name (for pg_roles and friends)."""
        with self._lock:
            return [self._users[name] for name in sorted(self._users)]

    def reload(self) -> ConfigFileError | None:
        """Re-read the file if it changed; the error if the new contents are unusable.

        One reload at a time (the watch, a login and a Flight call may all ask): the stat,
        the read and the store happen in that order under ``_reloading``, so older contents
        never replace newer ones. Unusable is malformed, unreadable, not a regular file, or
        gone once it was read (a non-atomic replace leaves the path empty for a moment):
        the last good contents stay, and the same unusable file is not read again until
        its stamp changes. Only before any good read does a missing file mean no users."""
        with self._reloading:
            try:
                status = os.stat(self.path)
                stamp = (status.st_ino, status.st_size, status.st_mtime_ns)
            except FileNotFoundError:
                stamp = (0, 0, 0)
            except OSError as error:  # ELOOP, EACCES, ENOTDIR, ESTALE …
                return ConfigFileError(f"cannot read users file {self.path}: {error.strerror}")
            if stamp == self._stamp:
                return None
            if self._unusable is not None and self._unusable[0] == stamp:
                return self._unusable[1]
            try:
                if stamp == (0, 0, 0) and self._stamp is not None:
                    raise ConfigFileError(f"users file {self.path} is missing")
                users = read_users(self.path)
            except ConfigFileError as error:
                self._unusable = (stamp, error)
                return error
            with self._lock:
                self._stamp, self._users = stamp, users
                self.generation += 1
            self._unusable = None
        return None


class UsersWatch:
    """Reloads a users file every ``interval_s`` on a daemon thread of its own until
    ``stop``: the server's sessions learn of a change within that time (a malformed new
    file is logged once per change and the last good contents stay)."""

    def __init__(self, users: UsersFile, interval_s: float) -> None:
        self.users = users
        self.interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="topicbase-users-watch",
                                        daemon=True)  # fmt: skip

    def start(self) -> UsersWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the thread to end; waits for it at most a few polls (a reload stuck in the
        kernel, e.g. on a hung network file system, leaves the daemon thread behind)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=max(1.0, 4 * self.interval_s))

    def _run(self) -> None:
        reported: str | None = None
        while not self._stopping.wait(self.interval_s):
            try:
                error: BaseException | None = self.users.reload()
            except Exception as unexpected:  # never end the watch: sessions rely on it
                error = unexpected
            message = None if error is None else str(error)
            if message is not None and message != reported:
                log.error("users file not reloaded, keeping its last good contents: %s", message)
            reported = message


# -- writing ----------------------------------------------------------------------------------
def render_users(users: dict[str, UserEntry]) -> bytes:
    document = {
        "format": FORMAT,
        "users": {
            name: {
                "scram": entry.scram,
                **({"md5": entry.md5} if entry.md5 else {}),
                **({"superuser": True} if entry.superuser else {}),
                **(
                    {"connection_limit": entry.connection_limit}
                    if entry.connection_limit is not None
                    else {}
                ),
            }
            for name, entry in sorted(users.items())
        },
    }
    return (json.dumps(document, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def add_user(
    path: str,
    name: str,
    password: str,
    *,
    with_md5: bool = False,
    superuser: bool = False,
    connection_limit: int | None = None,
) -> bool:
    """Create or replace user ``name`` in the users file at ``path``; True if it was new.

    Stores a SCRAM-SHA-256 verifier with a fresh salt (and the md5 hash only if
    ``with_md5``); the password itself is never written. The record is replaced whole, so
    ``superuser`` is what the caller says (re-adding a superuser without it demotes it, as
    ``ALTER ROLE ... NOSUPERUSER`` would), and so is ``connection_limit`` (None: none).
    """
    check_user_name(name)
    check_password(password)
    check_connection_limit(connection_limit)
    entry = UserEntry(
        name,
        make_scram_verifier(password).to_text(),
        make_md5_verifier(name, password) if with_md5 else None,
        superuser,
        connection_limit,
    )
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with _exclusive_lock(path + ".lock"):
        users = read_users(path)
        is_new = name not in users
        users[name] = entry
        write_atomic(path, render_users(users))
    written = read_users(path)
    assert written.get(name) == entry, "the users file holds what was just written"
    return is_new


def remove_user(path: str, name: str) -> bool:
    """Remove user ``name`` from the users file at ``path``; False if there was no such user.

    Objects the user owns and grants made to it stay in the catalog (PostgreSQL refuses
    ``DROP ROLE`` while they exist; here the users file is outside the database): a user
    re-added under the same name gets them back, and ``topicbase check`` reports them.
    """
    check_user_name(name)
    with _exclusive_lock(path + ".lock"):
        users = read_users(path)
        if name not in users:
            return False
        del users[name]
        write_atomic(path, render_users(users))
    return True


@contextlib.contextmanager
def _exclusive_lock(lock_path: str) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: a 0600 temp file, fsync, rename, fsync the directory."""
    directory = os.path.dirname(os.path.abspath(path))
    temp_path = f"{path}.tmp.{os.getpid()}"
    fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            os.fchmod(fd, FILE_MODE)  # exactly 0600 whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_path)
        raise
    directory_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)
