"""A throwaway PostgreSQL cluster for baselines (benchmarks only, never the product).

``find_bin_dir()`` looks for the server binaries in ``/usr/lib/postgresql/*/bin``
(15 preferred, else the newest) and, when there are none, installs Debian's
``postgresql`` package with ``apt-get`` (root only). ``ensure_psycopg()``
imports psycopg 3, ``pip install``-ing ``psycopg[binary]`` into the running
interpreter if it is missing (not a project dependency).

``Cluster`` is a context manager: ``initdb`` and ``pg_ctl`` refuse to run as
root, so they run through ``runuser -u topicbase-bench --`` (a system user
created if missing); the cluster lives in a temp dir owned by that user,
listens on 127.0.0.1 only on a free port with its unix socket in the temp
dir, and keeps PostgreSQL's defaults otherwise (``fsync``, ``synchronous_commit
= on``: commits are durable). On exit it is stopped with ``pg_ctl stop``
(killing the postmaster as a fallback) and the temp dir is deleted.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from types import ModuleType

BENCH_USER = "topicbase-bench"
PREFERRED_MAJOR = 15
START_TIMEOUT_S = 60


def _version_of(bin_dir: str) -> int:
    name = os.path.basename(os.path.dirname(bin_dir))
    return int(name) if name.isdigit() else 0


def _find_existing() -> str | None:
    found = [
        d
        for d in glob.glob("/usr/lib/postgresql/*/bin")
        if os.access(os.path.join(d, "initdb"), os.X_OK)
        and os.access(os.path.join(d, "pg_ctl"), os.X_OK)
    ]
    if not found:
        return None
    preferred = [d for d in found if _version_of(d) == PREFERRED_MAJOR]
    return preferred[0] if preferred else max(found, key=_version_of)


def find_bin_dir(log: Callable[[str], None] = print) -> str:
    """The directory of ``initdb``/``pg_ctl``; installs ``postgresql`` with apt if absent."""
    found = _find_existing()
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("PostgreSQL server binaries not found and cannot apt-get install them")
    log("PostgreSQL not found: apt-get install -y postgresql (benchmark baseline only)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, env=env, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "postgresql"], check=True, env=env, capture_output=True
    )
    found = _find_existing()
    if not found:
        raise RuntimeError("apt-get install postgresql left no /usr/lib/postgresql/*/bin")
    return found


def ensure_psycopg(log: Callable[[str], None] = print) -> ModuleType:
    """Import psycopg 3, ``pip install psycopg[binary]`` into this interpreter if missing."""
    try:
        return importlib.import_module("psycopg")
    except ImportError:
        pass
    log(f"psycopg not importable: pip install 'psycopg[binary]' into {sys.executable}")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "psycopg[binary]"],
        check=True,
    )
    importlib.invalidate_caches()
    return importlib.import_module("psycopg")


def short_version(version: str) -> str:
    """``postgres (PostgreSQL) 15.18 (Debian ...)`` -> ``PostgreSQL 15.18``."""
    return version.replace("postgres (PostgreSQL) ", "PostgreSQL ").split(" (")[0]


def ensure_user(name: str = BENCH_USER) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(name)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    """A temporary PostgreSQL cluster on 127.0.0.1; ``dsn`` once started."""

    def __init__(
        self,
        *,
        parent: str | None = None,
        settings: dict[str, str] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.log = log
        self.parent = parent
        self.settings = settings or {}
        self.bin_dir = ""
        self.root = ""
        self.port = 0
        self.version = ""
        self._as_user: list[str] = []
        self._started = False

    @property
    def data_dir(self) -> str:
        return os.path.join(self.root, "data")

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *args: str, timeout: float = START_TIMEOUT_S) -> str:
        done = subprocess.run(
            [*self._as_user, *args], capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{os.path.basename(args[0])} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        return done.stdout

    def start(self) -> Cluster:
        self.bin_dir = find_bin_dir(self.log)
        if os.geteuid() == 0:
            user = ensure_user()
            self._as_user = ["runuser", "-u", BENCH_USER, "--"]
        self.root = tempfile.mkdtemp(prefix="topicbase-pg-", dir=self.parent)
        if self._as_user:
            os.chown(self.root, user.pw_uid, user.pw_gid)
        os.chmod(self.root, 0o700)
        initdb = os.path.join(self.bin_dir, "initdb")
        self._run(
            initdb, "-D", self.data_dir, "-U", "postgres", "--auth=trust",
            "--encoding=UTF8", "--no-locale", "--no-sync",
        )  # fmt: skip
        self.port = free_port()
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            **self.settings,
        }
        with open(os.path.join(self.data_dir, "postgresql.conf"), "a", encoding="utf-8") as file:
            file.write("\n# topicbase bench\n")
            for key, value in conf.items():
                file.write(f"{key} = {value}\n")
        pg_ctl = os.path.join(self.bin_dir, "pg_ctl")
        self._started = True  # from here on, stop() must run
        self._run(
            pg_ctl, "-D", self.data_dir, "-l", os.path.join(self.root, "server.log"),
            "-w", "-t", str(START_TIMEOUT_S), "start",
        )  # fmt: skip
        self.version = self._run(os.path.join(self.bin_dir, "postgres"), "--version").strip()
        return self

    def _postmaster_pid(self) -> int | None:
        try:
            with open(os.path.join(self.data_dir, "postmaster.pid"), encoding="utf-8") as file:
                return int(file.readline().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        try:
            if self._started:
                pid = self._postmaster_pid()
                try:
                    self._run(
                        os.path.join(self.bin_dir, "pg_ctl"), "-D", self.data_dir,
                        "-m", "fast", "-w", "-t", "30", "stop",
                    )  # fmt: skip
                except (RuntimeError, subprocess.SubprocessError) as error:
                    self.log(f"pg_ctl stop failed ({error}); killing postmaster {pid}")
                    if pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGQUIT)
                        time.sleep(1.0)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                self._started = False
        finally:
            if self.root:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = ""

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
