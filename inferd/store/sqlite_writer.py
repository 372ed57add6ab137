"""The SQLite side of inferd.store.sqlite that runs off the loop: the writer thread and its group commits,
the lock file of the writer role, the integrity check and the mapping of sqlite3 errors to StoreError.

The writer owns the one read-write connection. It takes a write from its queue, opens a transaction and
keeps applying writes while more are queued (up to `commit_rows` rows or `interval_s` since the group's
first), then commits once: a lone write is committed at once, and under load the writes that arrive
during a commit form the next, larger group. Each write runs inside its own SAVEPOINT, so a failing
write rolls back alone; a failed COMMIT (or an error that loses the transaction) fails every write of
the group with StoreUnavailable. Results go back to the loop in one batch per group. The WAL's
checkpoints run on a thread of their own (inferd.store.sqlite_checkpoint), never inside a commit.
"""
from __future__ import annotations

import fcntl
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from inferd.store.db import Counters, StoreCorrupt, StoreError, StoreLocked, StoreUnavailable
from inferd.store.sqlite_checkpoint import Checkpointer
from inferd.store.schema import VERSION_QUERY, VERSION_TABLE, upgrade

EXEC, MANY, TX, PING = 0, 1, 2, 3
STOP = object()
BUSY_TIMEOUT_MS = 1000
MIN_FREE_BYTES = 1 << 20        # a ping says the disk is full below this much room for the file to grow
# An op: (kind, sql, params | rows | statements, future, rows, Ticket). A result: (future, value, error, rows).
Op = tuple[int, str, Any, Any, int, "Ticket"]
Result = tuple[Any, Any, "BaseException | None", int]

# Primary SQLite result codes: the database is fine but cannot be written or read right now.
_UNAVAILABLE_CODES = {5, 6, 7, 8, 10, 13, 14, 15}      # BUSY LOCKED NOMEM READONLY IOERR FULL CANTOPEN PROTOCOL
_CORRUPT_CODES = {11, 26}                               # CORRUPT NOTADB
_UNAVAILABLE_TEXT = ("disk is full", "disk i/o error", "database is locked", "readonly database",
                     "unable to open", "out of memory", "locking protocol")
_CORRUPT_TEXT = ("malformed", "not a database")


class Ticket:
    """Whether a queued op may still run. Its caller withdraws it when it gives up (a timeout) unless the
    writer has started it, and the writer skips a withdrawn op, so a caller told "not written" is right;
    a caller that finds it started waits for its outcome instead."""

    __slots__ = ("state",)
    _lock = threading.Lock()        # one for all tickets: held for a compare-and-set only

    def __init__(self) -> None:
        self.state = "queued"

    def start(self) -> bool:
        """Writer thread: True (and started) unless its caller withdrew it."""
        with self._lock:
            if self.state == "withdrawn":
                return False
            self.state = "started"
            return True

    def withdraw(self) -> bool:
        """Loop: True (and withdrawn) unless the writer started it."""
        with self._lock:
            if self.state == "started":
                return False
            self.state = "withdrawn"
            return True


def store_error(where: str, exc: BaseException) -> StoreError:
    """`exc` (from sqlite3, or a bad parameter) as the StoreError to raise in the caller."""
    if isinstance(exc, StoreError):
        return exc
    text = str(exc) or type(exc).__name__
    code = getattr(exc, "sqlite_errorcode", None)      # Python >= 3.11
    lowered = text.lower()
    cls: type[StoreError] = StoreError
    if (code is not None and code & 0xFF in _CORRUPT_CODES) or any(t in lowered for t in _CORRUPT_TEXT):
        cls = StoreCorrupt
    elif (code is not None and code & 0xFF in _UNAVAILABLE_CODES) or any(t in lowered for t in _UNAVAILABLE_TEXT) \
            or isinstance(exc, (MemoryError, OSError)):
        cls = StoreUnavailable
    error = cls(f"{where}: {text}")
    error.__cause__ = exc
    return error


def take_lock(path: str) -> int:
    """Hold the writer role of `path`: an exclusive flock on `<path>.lock` (released by the kernel if the
    process dies). Returns its descriptor; StoreLocked when another process (or Database) holds it."""
    lock_path = f"{path}.lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StoreUnavailable(f"{path}: cannot open its lock file {lock_path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise StoreLocked(f"{path}: another inferd{who} holds this database (lock file {lock_path}); "
                          "only one daemon may use a state directory") from None
    except OSError as exc:
        os.close(fd)
        raise StoreUnavailable(f"{path}: cannot lock {lock_path}: {exc}") from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def release_lock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def connect(path: str, *, query_only: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit); usable from the thread that owns it."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=256)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    if query_only:
        conn.execute("PRAGMA query_only = ON")
    return conn


def check_integrity(conn: sqlite3.Connection, path: str) -> None:
    """PRAGMA integrity_check before anything writes to the file: StoreCorrupt unless it says "ok"."""
    refuse = ("; refusing to start rather than start with an empty database (the file is left as it is: "
              "restore it from a backup, or move it aside to start afresh)")
    try:
        rows = conn.execute("PRAGMA integrity_check(10)").fetchall()
    except Exception as exc:
        error = store_error(path, exc)
        if isinstance(error, StoreCorrupt):
            raise StoreCorrupt(f"{error}{refuse}") from exc
        raise error from exc
    problems = [str(r[0]) for r in rows if r and r[0] != "ok"]
    if problems or not rows:
        raise StoreCorrupt(f"{path}: integrity check failed: {'; '.join(problems) or 'no answer'}{refuse}")


class Writer:
    """The writer thread's body: `run` sets up (lock, connect, check, schema), reports through `opened`,
    serves the queue until STOP, then closes the connection and releases the lock."""

    def __init__(self, path: str, *, synchronous: str, interval_s: float, commit_rows: int, counters: Counters,
                 deliver: Callable[[list[Result]], None]) -> None:
        self.path = path
        self.synchronous = synchronous
        self.interval_s = interval_s
        self.commit_rows = commit_rows
        self.counters = counters
        self.deliver = deliver
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.conn: sqlite3.Connection | None = None
        self.cur: sqlite3.Cursor | None = None
        self.checkpointer = Checkpointer(path)

    def run(self, opened: Callable[[BaseException | None], None]) -> None:
        lock_fd = None
        try:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            lock_fd = take_lock(self.path)
            self._setup()
            self.checkpointer.start()
        except BaseException as exc:
            self.checkpointer.stop()
            self._close_conn()
            if lock_fd is not None:
                release_lock(lock_fd)
            opened(exc if isinstance(exc, StoreError) else store_error(self.path, exc))
            return
        opened(None)
        try:
            self._serve()
        finally:
            self.checkpointer.stop()        # before the connection: the last one to close checkpoints
            self._close_conn()
            release_lock(lock_fd)

    def _setup(self) -> None:
        self.conn = conn = connect(self.path)
        check_integrity(conn, self.path)
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreUnavailable(f"{self.path}: cannot use WAL mode here (journal_mode stays {mode!r})")
            conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA journal_size_limit = 67108864")
            conn.execute("PRAGMA wal_autocheckpoint = 0")      # the Checkpointer's thread does it
            conn.execute(VERSION_TABLE)
            steps = upgrade("sqlite", conn.execute(VERSION_QUERY).fetchone()[0], now=time.time(), where=self.path)
            if steps:
                conn.execute("BEGIN IMMEDIATE")
                for sql, params in steps:
                    conn.execute(sql, params)
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise store_error(self.path, exc) from exc
        self.cur = conn.cursor()

    def _close_conn(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except sqlite3.Error:
                pass
            self.conn = self.cur = None

    def _serve(self) -> None:
        get, get_nowait = self.queue.get, self.queue.get_nowait
        while (op := get()) is not STOP:
            ok: list[Result] = []
            failed: list[Result] = []
            rows, deadline, stop = 0, time.monotonic() + self.interval_s, False
            while True:
                if op[5].start():
                    self._apply(op, ok, failed)
                else:               # its caller gave up before it ran: never written
                    failed.append((op[3], None, None, op[4]))
                rows += op[4]
                if rows >= self.commit_rows or time.monotonic() >= deadline:
                    break
                try:
                    op = get_nowait()
                except queue.Empty:
                    break
                if op is STOP:
                    stop = True
                    break
            self._commit(ok, failed)
            if stop:
                return

    def _apply(self, op: Op, ok: list[Result], failed: list[Result]) -> None:
        kind, sql, params, fut, n = op[:5]
        conn, cur = self.conn, self.cur
        try:
            if not conn.in_transaction:
                cur.execute("BEGIN IMMEDIATE")
            cur.execute("SAVEPOINT op")
        except Exception as exc:
            self._abort(ok, failed, exc)
            failed.append((fut, None, store_error(self.path, exc), n))
            return
        try:
            if kind == EXEC:
                value: Any = cur.execute(sql, params).rowcount
            elif kind == MANY:
                cur.executemany(sql, params)
                value = None
            elif kind == TX:
                value = [cur.execute(s, p).rowcount for s, p in params]
            else:
                value = self._check_room()
            cur.execute("RELEASE op")
        except Exception as exc:
            failed.append((fut, None, store_error(self.path, exc), n))
            try:
                if conn.in_transaction:
                    cur.execute("ROLLBACK TO op")
                    cur.execute("RELEASE op")
                else:
                    self._abort(ok, failed, exc)
            except Exception as again:
                self._abort(ok, failed, again)
            return
        ok.append((fut, value, None, n))

    def _check_room(self) -> None:
        """A ping: StoreUnavailable when the file cannot grow (its page limit reached with no free page,
        or the file system nearly full), so the store stays unavailable until there is room again."""
        cur = self.cur
        pages = cur.execute("PRAGMA page_count").fetchone()[0]
        limit = cur.execute("PRAGMA max_page_count").fetchone()[0]
        if pages >= limit and not cur.execute("PRAGMA freelist_count").fetchone()[0]:
            raise StoreUnavailable(f"{self.path}: database or disk is full (max_page_count {limit} reached)")
        fs = os.statvfs(os.path.dirname(self.path) or ".")
        if fs.f_bavail * fs.f_frsize < MIN_FREE_BYTES:
            raise StoreUnavailable(f"{self.path}: disk is full ({fs.f_bavail * fs.f_frsize} bytes free)")

    def _abort(self, ok: list[Result], failed: list[Result], exc: BaseException) -> None:
        """The group's transaction is lost: roll back what is left of it and fail the writes it held."""
        try:
            if self.conn.in_transaction:
                self.cur.execute("ROLLBACK")
        except Exception:
            pass
        for fut, _, _, n in ok:
            error = StoreUnavailable(f"{self.path}: not committed, the transaction was rolled back ({exc})")
            failed.append((fut, None, error, n))
        ok.clear()

    def _commit(self, ok: list[Result], failed: list[Result]) -> None:
        seconds = None
        if ok:
            start = time.perf_counter()
            try:
                self.cur.execute("COMMIT")
                seconds = time.perf_counter() - start
                self.checkpointer.committed()
            except Exception as exc:
                self._abort(ok, failed, exc)
        elif self.conn.in_transaction:
            self._abort(ok, failed, StoreError("nothing to commit"))
        rows = sum(r[3] for r in ok)
        self.counters.record(rows, len(failed), seconds if rows else None)     # a ping alone is no commit
        self.deliver(ok + failed)
