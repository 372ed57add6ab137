"""A throwaway PostgreSQL server for tests: initdb in a temp dir, start on a free loopback port, stop at the end.

`pg_server` (session) starts one server the first time a test asks for it; `pg_dsn` gives each test a fresh
database on it (dropped afterwards), so a test sees empty tables like a fresh SQLite file. Without the
server binaries (initdb, pg_ctl) the tests that need it are skipped, saying how to install them.
PostgreSQL refuses to run as root: as root, initdb and pg_ctl run as the `postgres` system user.
Test cluster only: trust auth on loopback and the socket directory, nothing else listens.
"""
from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

START_TIMEOUT_S = 15.0
NOT_FOUND = "PostgreSQL server binaries not found (apt-get install postgresql)"


class PgServerError(RuntimeError):
    """The test server could not be set up; the message says which step and its output."""


def find_bin_dir() -> Path | None:
    """The directory holding initdb and pg_ctl: PATH first, then the newest /usr/lib/postgresql/*/bin."""
    on_path = shutil.which("initdb")
    candidates = [Path(on_path).parent] if on_path else []

    def version(d: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", d))

    candidates += [Path(d) for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    candidates += [Path("/usr/local/pgsql/bin")]
    for d in candidates:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self, bin_dir: Path, directory: Path | None = None) -> None:
        self.bin_dir = bin_dir
        self.as_user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise PgServerError("running as root and there is no `postgres` system user to run the "
                                    "server as (PostgreSQL refuses root)") from None
            self.as_user = "postgres"
        self.dir = directory or Path(tempfile.mkdtemp(prefix="inferd-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = 0
        self.user = "postgres"
        self.started_in = 0.0       # seconds: initdb + start
        self._names = itertools.count(1)

    def _run(self, *args: str, timeout: float = START_TIMEOUT_S) -> None:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self.as_user:
            if shutil.which("runuser"):
                cmd = ["runuser", "-u", self.as_user, "--", *cmd]
            else:
                cmd = ["su", self.as_user, "-s", "/bin/sh", "-c", shlex.join(cmd)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        except subprocess.TimeoutExpired:
            raise PgServerError(f"{args[0]} took longer than {timeout:.0f} s; log: {self.log}") from None
        if out.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise PgServerError(f"{' '.join(args[:2])} failed ({out.returncode}): {out.stdout}{out.stderr}{log}")

    def start(self) -> None:
        (self.dir / "owner.pid").write_text(str(os.getpid()))
        if self.as_user:
            shutil.chown(self.dir, user=self.as_user)
        # -N: the initial files need no fsync (a crash here only loses the throwaway cluster); the server
        # itself runs with fsync on, as in production.
        self._run("initdb", "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8",
                  "--locale=C", "-N")
        for attempt in range(3):
            self.port = free_port()
            opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=on "
                    "-c max_connections=200 -c shared_buffers=32MB")
            try:
                self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w",
                          "-t", str(int(START_TIMEOUT_S)), "-o", opts, timeout=START_TIMEOUT_S + 5)
                return
            except PgServerError:
                if attempt == 2 or "already in use" not in self.log.read_text(errors="replace"):
                    raise

    @classmethod
    def reap_orphans(cls, bin_dir: Path) -> None:
        """Stop the servers of test sessions that died without stopping theirs (killed pytest)."""
        for owner in Path(tempfile.gettempdir()).glob("inferd-pg-*/owner.pid"):
            try:
                os.kill(int(owner.read_text()), 0)
                continue            # its session is still running
            except ProcessLookupError:
                pass
            except (OSError, ValueError):
                continue
            try:
                cls(bin_dir, owner.parent).stop()
            except PgServerError:
                pass

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "10", timeout=20)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def create_database(self) -> str:
        """A new empty database; its DSN."""
        name = f"t{os.getpid()}_{next(self._names)}"
        self._admin(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{dsn.rsplit("/", 1)[1]}" WITH (FORCE)')


@contextlib.contextmanager
def script_server() -> Iterator[PgServer]:
    """A started server for a script (bench/), stopped after; the script exits naming what is missing
    when PostgreSQL is not installed."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        sys.exit(NOT_FOUND)
    server = PgServer(bin_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip(NOT_FOUND)
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")
    PgServer.reap_orphans(bin_dir)
    try:
        server = PgServer(bin_dir)
    except PgServerError as e:
        pytest.skip(str(e))
    started = time.monotonic()
    try:
        server.start()
        server.started_in = time.monotonic() - started
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh database on the session's server, dropped after the test."""
    dsn = pg_server.create_database()
    yield dsn
    pg_server.drop_database(dsn)
