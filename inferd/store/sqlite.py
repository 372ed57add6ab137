"""SqliteDatabase: the store in one SQLite file, written by one thread in group commits.

Durability: WAL mode. With synchronous = "normal" (the default) a commit is in the OS before a write
returns, so it survives the process being killed (SIGKILL, OOM, a crash) but not a power cut or kernel
panic, which may lose the last commits (never corrupt the file). With "full" every commit is fsynced
first: it survives power loss too, at the cost of one fsync per group. inferd promises the first (a
response the client received completely is in the ledger after a crash of the daemon); hosts that must
keep billing across power loss set [store] synchronous = "full".

One process owns the file: open() takes an exclusive lock on `<path>.lock`, so a second daemon on the
same state directory fails fast with StoreLocked. open() also runs PRAGMA integrity_check (its time grows
with the file) and refuses a damaged file with StoreCorrupt rather than start empty; it never deletes or
recreates a file. Writes queue to the writer thread (inferd.store.sqlite_writer), reads run on their
own read-only connection in a reader thread; the event loop only enqueues and awaits.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from inferd.store.db import Counters, Database, DbStats, StoreError, StoreUnavailable
from inferd.store.schema import SCHEMA_VERSION, VERSION_QUERY, upgrade
from inferd.store.sqlite_writer import EXEC, MANY, PING, STOP, TX, Result, Ticket, Writer, connect, store_error

if sys.version_info >= (3, 11):
    from asyncio import timeout as time_bound
else:                               # aiohttp's own dependency before 3.11 (raises asyncio.TimeoutError too)
    from async_timeout import timeout as time_bound

SYNCHRONOUS = ("normal", "full")
STARTED_GRACE_S = 1.0   # a write already started when its caller's bound ran out: how much longer it waits


class SqliteDatabase(Database):
    dialect = "sqlite"

    def __init__(self, path: str, *, synchronous: str = "normal", commit_interval_ms: float = 50,
                 commit_rows: int = 1000, max_pending_writes: int = 20000, readonly: bool = False,
                 timeout_s: float = 5.0) -> None:
        """`readonly`: reads only, beside a running daemon (`inferd usage`): no lock, no writer, no
        integrity check or schema change; the file must exist and have the current schema."""
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}")
        for name, value in (("commit_interval_ms", commit_interval_ms), ("commit_rows", commit_rows),
                            ("max_pending_writes", max_pending_writes), ("timeout_s", timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.where = path
        self.timeout_s = float(timeout_s)
        self._synchronous = synchronous
        self._interval_s = commit_interval_ms / 1000
        self._commit_rows = int(commit_rows)
        self._max_pending = int(max_pending_writes)
        self._readonly = readonly
        self._counters = Counters()
        self._state = "new"                 # new -> opening -> open -> closing -> closed (-> opening again)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: Writer | None = None
        self._exited: asyncio.Future | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._read_conn = None
        self._pending = 0                   # rows queued or being written, not yet resolved on the loop
        self._waiters = 0                   # writers waiting for room
        self._progress: asyncio.Event | None = None     # set whenever writes resolve (made in open: loop-bound)
        self._delivered_at = 0.0            # loop.time() the writer last handed back a group (the ping's clue)
        self._commits_seen = 0              # Counters.commits as of then
        self._commit_failure: StoreUnavailable | None = None    # the last group's, until a commit succeeds

    # -- lifecycle ---------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._state in ("opening", "open"):
            raise StoreError(f"{self.where}: already open")
        if self._state == "closing":
            raise StoreError(f"{self.where}: still closing")
        self._state = "opening"
        loop = self._loop = asyncio.get_running_loop()
        self._progress = asyncio.Event()
        self._pending = self._waiters = 0
        self._delivered_at, self._commit_failure = loop.time(), None
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferd-store-reader")
        try:
            if self._readonly:
                await loop.run_in_executor(self._reader, self._check_readable)
            else:
                await self._start_writer(loop)
        except BaseException:
            await self._stop_reader()
            self._state = "closed"
            raise
        self._state = "open"

    async def _start_writer(self, loop: asyncio.AbstractEventLoop) -> None:
        opened: asyncio.Future = loop.create_future()
        exited: asyncio.Future = loop.create_future()
        writer = Writer(self.where, synchronous=self._synchronous, interval_s=self._interval_s,
                        commit_rows=self._commit_rows, counters=self._counters, deliver=self._deliver)

        def body() -> None:
            try:
                writer.run(lambda exc: self._call(_settle, opened, exc))
            finally:
                self._call(_settle, exited, None)

        thread = threading.Thread(target=body, name="inferd-store-writer", daemon=True)
        thread.start()
        try:
            await asyncio.shield(opened)
        except BaseException:           # it failed (the thread has ended), or open() was cancelled: stop it
            writer.queue.put(STOP)
            await asyncio.shield(exited)
            raise
        self._writer, self._exited = writer, exited

    async def close(self) -> None:
        if self._state != "open":
            return
        self._state = "closing"
        while self._pending or self._waiters:
            self._progress.clear()
            await self._progress.wait()
        await self._stop_reader()
        if self._writer is not None:
            self._writer.queue.put(STOP)
            await asyncio.shield(self._exited)      # set by the thread as its last act
        self._writer = self._exited = None
        self._state = "closed"

    async def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        await asyncio.shield(self._loop.run_in_executor(reader, self._close_reader))
        reader.shutdown(wait=False)     # its last job is done: the thread exits at once

    # -- writes ------------------------------------------------------------------------------------

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self._submit(EXEC, sql, params, 1)

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]], *, ordered: bool = False) -> None:
        # `ordered` needs nothing here: one writer thread commits in sequence order
        rows = list(rows)
        if rows:
            await self._submit(MANY, sql, rows, len(rows))

    async def transaction(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        statements = list(statements)
        if not statements:
            return []
        return await self._submit(TX, "", statements, len(statements))

    async def ping(self, timeout: float) -> None:
        """Through the writer's queue: the writer answers, can take the write lock, and the file has room.
        A ping still queued after `timeout` behind writes the writer is getting through is no failure (a
        long queue is load, not an outage): only a writer that finished nothing meanwhile (stuck on one op
        or commit) or whose last commit failed is."""
        self._check_writable()
        ticket, fut, asked = Ticket(), self._loop.create_future(), self._loop.time()
        fut.add_done_callback(_retrieve)
        self._writer.queue.put((PING, "", (), fut, 0, ticket))     # no room wait: it adds no rows
        try:
            async with time_bound(timeout):
                return await asyncio.shield(fut)
        except asyncio.TimeoutError:
            pass
        ticket.withdraw()
        if self._delivered_at < asked:
            raise self.timed_out("ping (the writer finished nothing meanwhile)", timeout)
        if self._commit_failure is not None:
            raise self._commit_failure

    def _check_writable(self) -> None:
        if self._state != "open":
            raise StoreError(f"{self.where}: the store is {'not open' if self._state == 'new' else 'closed'}")
        if self._readonly:
            raise StoreError(f"{self.where}: opened read-only")

    async def _submit(self, kind: int, sql: str, params: Any, rows: int) -> Any:
        """The op queued and awaited for at most call_timeout(). A caller that gives up withdraws its op,
        so the writer skips it; if the writer has started it, its outcome is awaited STARTED_GRACE_S more
        (a write that commits is not reported failed) and, still unknown, handed over as `pending`."""
        self._check_writable()
        bound, ticket, fut = self.call_timeout(), Ticket(), None
        try:
            async with time_bound(bound):      # a writer stuck on I/O fails its callers, not holds them
                fut = await self._enqueue(kind, sql, params, rows, ticket)
                return await asyncio.shield(fut)
        except asyncio.TimeoutError:
            pass
        if fut is None or ticket.withdraw():        # not queued, or withdrawn: it is never written
            raise self.timed_out("write", bound)
        try:
            async with time_bound(STARTED_GRACE_S):
                return await asyncio.shield(fut)
        except asyncio.TimeoutError:
            fut.add_done_callback(_retrieve)
            raise self.timed_out("write", bound + STARTED_GRACE_S, pending=fut) from None

    async def _enqueue(self, kind: int, sql: str, params: Any, rows: int, ticket: Ticket) -> asyncio.Future:
        if self._pending >= self._max_pending:
            self._waiters += 1
            try:
                while self._pending >= self._max_pending:
                    self._progress.clear()
                    await self._progress.wait()
            finally:
                self._waiters -= 1
        fut = self._loop.create_future()
        self._pending += rows
        self._writer.queue.put((kind, sql, params, fut, rows, ticket))
        return fut

    def _deliver(self, results: list[Result]) -> None:
        """Writer thread: hand a group's results to the loop."""
        self._call(self._resolve, results)

    def _resolve(self, results: list[Result]) -> None:
        self._delivered_at = self._loop.time()
        commits = self._counters.commits
        if commits != self._commits_seen:
            self._commits_seen, self._commit_failure = commits, None
        for fut, value, error, rows in results:
            self._pending -= rows
            if isinstance(error, StoreUnavailable):
                self._commit_failure = error
                self.health.failed(error)       # readiness: unavailable until a ping succeeds
            if fut.done():              # its caller was cancelled; the write itself happened (or failed)
                continue
            if error is None:
                fut.set_result(value)
            else:
                fut.set_exception(error)
        self._progress.set()

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:            # the loop is closed: nobody is waiting any more
            pass

    # -- reads -------------------------------------------------------------------------------------

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        if self._state != "open":
            raise StoreError(f"{self.where}: the store is {'not open' if self._state == 'new' else 'closed'}")
        bound = self.call_timeout()
        try:
            async with time_bound(bound):
                return await self._loop.run_in_executor(self._reader, self._read, sql, params)
        except asyncio.TimeoutError:
            raise self.timed_out("read", bound) from None

    def _read(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        try:
            if self._read_conn is None:
                self._read_conn = connect(self.where, query_only=True)
            return self._read_conn.execute(sql, params).fetchall()
        except Exception as exc:
            raise store_error(self.where, exc) from exc

    def _check_readable(self) -> None:
        if not os.path.isfile(self.where):
            raise StoreUnavailable(f"{self.where}: no database here (has the daemon run with this state directory?)")
        try:
            version = self._read(VERSION_QUERY, ())[0][0]
        except StoreError as exc:
            raise StoreError(f"{self.where}: not an inferd database ({exc})") from exc
        if upgrade("sqlite", version, now=0.0, where=self.where):
            raise StoreError(f"{self.where}: schema version {version} is older than this inferd's "
                             f"{SCHEMA_VERSION}; start the daemon once to upgrade it")

    def _close_reader(self) -> None:
        if self._read_conn is not None:
            self._read_conn.close()
            self._read_conn = None

    # -- statistics --------------------------------------------------------------------------------

    def stats(self) -> DbStats:
        return self._counters.snapshot(self._pending)


def _retrieve(fut: asyncio.Future) -> None:
    """A future nobody may await any more: its error is not "never retrieved"."""
    if not fut.cancelled():
        fut.exception()


def _settle(fut: asyncio.Future, exc: BaseException | None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)
