"""A throwaway PostgreSQL server for the tests: Debian's binaries, a cluster in a temporary folder on 127.0.0.1.

The tests that use it run in ``nox -s online_postgres`` (which sets ``REINFORGE_ONLINE_POSTGRES=1``);
elsewhere they are skipped, so the default test sessions start no server.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENABLE_ENV = "REINFORGE_ONLINE_POSTGRES"
USER = "reinforge"


def binaries() -> Path | None:
    """The newest /usr/lib/postgresql/*/bin holding initdb and pg_ctl (Debian's layout), or one on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def skip_reason() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None."""
    if os.environ.get(ENABLE_ENV) != "1":
        return f"PostgreSQL tests run in `nox -s online_postgres` (or set {ENABLE_ENV}=1)"
    if binaries() is None:
        return "PostgreSQL's binaries (initdb, pg_ctl) are not installed: apt-get install -y postgresql"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    host: str
    port: int
    password: str
    pg_ctl: Callable[..., None]

    def crash_and_restart(self) -> None:
        """Stop the server the way a crash does (``-m immediate``: no checkpoint), then start it: it recovers from WAL."""
        self.pg_ctl("-m", "immediate", "-w", "stop")
        self.pg_ctl("-w", "-t", "60", "start")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@{self.host}:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(self.url(dbname), password=self.password, autocommit=True)

    def create_database(self, name: str) -> str:
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # a name the tests make up
        return self.url(name)


@contextlib.contextmanager
def server() -> Iterator[Server]:
    """initdb + pg_ctl start in a temporary folder (as the ``postgres`` user when run as root); stopped at the end."""
    bindir = binaries()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="reinforge-pg-"))
    password = secrets.token_hex(16)
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to Debian's postgres user
        owner = pwd.getpwnam("postgres")
        for path in (root, pwfile):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()

    def run(*args: str) -> None:
        proc = subprocess.run([*as_user, *args], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")

    run(str(bindir / "initdb"), "-D", str(data), "-U", USER, "--pwfile", str(pwfile), "--auth", "scram-sha-256",
        "-E", "UTF8", "--no-sync")  # fmt: skip
    options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={root} -c max_connections=100"

    def pg_ctl(*args: str) -> None:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), *args)

    pg_ctl("-w", "-t", "60", "start")
    try:
        yield Server("127.0.0.1", port, password, pg_ctl)
    finally:
        with contextlib.suppress(Exception):
            pg_ctl("-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)
