"""The PostgreSQL store (psycopg 3, async): the shared store of a cluster, many nodes writing at once.

Each `execute`, `execute_many` and `transaction` is its own transaction on a pooled connection,
committed before it returns (the server's fsync and synchronous_commit decide how durable that is;
a connection lost during COMMIT raises StoreUnavailable, and the write may or may not have landed).
No writer role: every node writes. Schema creation and upgrades (inferd.store.schema.upgrade) run in
one transaction under a transaction-scoped advisory lock, so nodes starting together take turns.
Repositories' `?` placeholders become psycopg's `%s` (and a literal `%` becomes `%%`); NUMERIC
results (SUM of a BIGINT, say) come back as int or float, and BYTEA as bytes, like SQLite's.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from inferd.store.db import Counters, Database, DbStats, StoreError, StoreTimeout, StoreUnavailable
from inferd.store.postgres_calls import BoundedCalls, Call
from inferd.store.postgres_conn import Pinger, configurer, connection_kwargs, redact, to_pyformat
from inferd.store.schema import VERSION_QUERY, VERSION_TABLE, upgrade

T = TypeVar("T")
SCHEMA_LOCK = 0x696E66657264          # pg_advisory_xact_lock key while creating the schema ("inferd")
ORDERED_WRITE_LOCK = 0x696E66657265   # ... for ordered writes (Database.execute_many): one at a time, cluster-wide
CONNECT_TIMEOUT_S = 10
RETRIES = 3                           # a deadlock or serialization failure rolls back: run it again
RETRY_SQLSTATES = ("40001", "40P01")
QUERY_CANCELED = "57014"


class PostgresDatabase(BoundedCalls, Database):
    dialect = "postgres"

    def __init__(self, dsn: str, *, max_pending_writes: int = 20_000, pool_size: int = 4,
                 timeout_s: float = 5.0) -> None:
        if max_pending_writes < 1 or pool_size < 1:
            raise ValueError(f"max_pending_writes and pool_size must be >= 1, got {max_pending_writes}, {pool_size}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._dsn = dsn
        self.where = redact(dsn)
        self.timeout_s = float(timeout_s)
        self._secret = self._password(dsn)
        self._pinger = Pinger(dsn, self.where, self.timeout_s, self._message)
        self._pool_size = pool_size
        self._pool: AsyncConnectionPool | None = None
        self._room = asyncio.Semaphore(max_pending_writes)
        self._busy = asyncio.Semaphore(pool_size)   # one operation per pooled connection; the rest wait here
        self._active = 0                            # calls under way (reads too): close waits for them
        self._tasks: set[asyncio.Task] = set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._closing = False
        self._lifecycle = asyncio.Lock()            # open and close, one at a time
        self._counters = Counters()
        self._pending = 0                           # writes admitted past the backpressure, not finished

    @staticmethod
    def _password(dsn: str) -> str | None:
        try:
            return psycopg.conninfo.conninfo_to_dict(dsn).get("password") or None
        except psycopg.Error:
            return None

    def _message(self, e: BaseException) -> str:
        text = (getattr(getattr(e, "diag", None), "message_primary", None) or str(e)).strip()
        return text.replace(self._secret, "***") if self._secret else text

    # ---- lifecycle ----------------------------------------------------------------------------------------
    async def open(self) -> None:
        async with self._lifecycle:
            if self._pool is None:
                await self._open()

    async def _open(self) -> None:
        try:
            conn = await psycopg.AsyncConnection.connect(self._dsn, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as e:
            raise StoreUnavailable(f"cannot connect to PostgreSQL at {self.where}: {self._message(e)}") from None
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                await conn.execute(VERSION_TABLE)
                current = (await (await conn.execute(VERSION_QUERY)).fetchone() or (None,))[0]
                for sql, params in upgrade("postgres", current, now=time.time(), where=self.where):
                    await conn.execute(to_pyformat(sql), tuple(params))
        except psycopg.OperationalError as e:
            raise StoreUnavailable(f"PostgreSQL at {self.where}: creating the schema: {self._message(e)}") from None
        except psycopg.Error as e:
            raise StoreError(f"PostgreSQL at {self.where}: creating the schema: {self._message(e)}") from None
        finally:
            await conn.close()
        pool = AsyncConnectionPool(self._dsn, min_size=self._pool_size, max_size=self._pool_size, open=False,
                                   kwargs={"autocommit": False, **connection_kwargs(self.timeout_s)},
                                   configure=configurer(self.timeout_s), check=AsyncConnectionPool.check_connection,
                                   timeout=CONNECT_TIMEOUT_S, name=f"inferd-store {self.where}")
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except BaseException as e:
            await pool.close()      # cancelled too: an unclosed pool's workers would keep reconnecting
            if isinstance(e, PoolTimeout):
                raise StoreUnavailable(f"cannot connect to PostgreSQL at {self.where}: no connection "
                                       f"within {CONNECT_TIMEOUT_S} s") from None
            raise
        self._pool = pool
        self._closing = False

    async def close(self) -> None:
        async with self._lifecycle:
            if self._pool is None:
                return
            self._closing = True            # new calls are refused; those under way finish
            await self._drained.wait()
            pool, self._pool = self._pool, None
            await self._pinger.close()
            await pool.close()

    # ---- the interface ------------------------------------------------------------------------------------
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        (count,) = await self._write([(sql, params)], rows=1)
        return count

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]], *, ordered: bool = False) -> None:
        if rows:
            await self._write([(sql, rows)], rows=len(rows), many=True, ordered=ordered)

    async def transaction(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        if not statements:
            return []
        return await self._write(statements, rows=len(statements))

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        async def read(conn: psycopg.AsyncConnection) -> list[tuple]:
            async with conn.cursor() as cur:
                await cur.execute(to_pyformat(sql), tuple(params))
                result = await cur.fetchall() if cur.description is not None else []
            await conn.rollback()
            return result

        self._enter()
        return await self._wait(self._spawn(read), Call(), "read")

    async def ping(self, timeout: float) -> None:
        """`SELECT 1` on the ping's own connection (inferd.store.postgres_conn.Pinger)."""
        if self._pool is None or self._closing:
            raise StoreError(f"PostgreSQL store {self.where} is not open")
        await self._pinger.ping(timeout)

    def stats(self) -> DbStats:
        return self._counters.snapshot(self._pending)

    # ---- the work -----------------------------------------------------------------------------------------
    def _enter(self) -> None:
        if self._pool is None or self._closing:
            raise StoreError(f"PostgreSQL store {self.where} is not open")
        self._active += 1
        self._drained.clear()

    def _leave(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._drained.set()

    async def _write(self, statements: Sequence[tuple[str, Any]], *, rows: int, many: bool = False,
                     ordered: bool = False) -> list[int]:
        """Wait for room (backpressure), then run the write in a task of its own (inferd.store.postgres_calls:
        a caller whose bound runs out cancels it before its COMMIT; a caller cancelled while it runs, a
        client that left, does not, as with SQLite's writer queue)."""
        self._enter()
        try:
            await self._room.acquire()
        except BaseException:
            self._leave()
            raise
        self._pending += 1
        call = Call()
        task = self._spawn(lambda conn: self._write_now(conn, statements, rows, many, ordered, call), write=True)
        return await self._wait(task, call, "write")

    async def _write_now(self, conn: psycopg.AsyncConnection, statements: Sequence[tuple[str, Any]], rows: int,
                         many: bool, ordered: bool, call: Call) -> list[int]:
        counts: list[int] = []
        async with conn.cursor() as cur:
            if ordered:
                # Taken before the first nextval and held until COMMIT has made the rows visible: a
                # sequence number handed out later therefore becomes visible later, on every node.
                await cur.execute("SELECT pg_advisory_xact_lock(%s)", (ORDERED_WRITE_LOCK,))
            for sql, params in statements:
                if many:
                    await cur.executemany(to_pyformat(sql), [tuple(r) for r in params])
                else:
                    await cur.execute(to_pyformat(sql), tuple(params))
                counts.append(cur.rowcount)
        started = time.perf_counter()
        call.committing = True      # from here its caller waits for the outcome rather than cancel it
        await conn.commit()
        self._counters.record(rows, 0, time.perf_counter() - started)
        return counts

    async def _run(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        """`work` on a pooled connection, run again after a deadlock or serialization failure; psycopg's
        errors become the store's: the server gone or out of resources -> StoreUnavailable, the rest
        (a constraint, bad SQL) -> StoreError, each raised in its own caller only."""
        pool = self._pool
        if pool is None:
            raise StoreError(f"PostgreSQL store {self.where} is not open")
        async with self._busy:
            for attempt in range(RETRIES):
                try:
                    async with pool.connection(timeout=self.timeout_s) as conn:
                        try:
                            return await work(conn)
                        except psycopg.Error:
                            if not conn.closed:
                                try:
                                    await conn.rollback()
                                except psycopg.Error:
                                    pass        # the connection is broken: the pool discards it
                            raise
                except psycopg.Error as e:
                    if e.sqlstate in RETRY_SQLSTATES and attempt < RETRIES - 1:
                        continue
                    self._counters.record(0, 1, None)
                    raise self._error(e) from None
        raise StoreError(f"PostgreSQL at {self.where}: gave up after {RETRIES} attempts")  # not reached

    def _error(self, e: psycopg.Error) -> StoreError:
        if isinstance(e, PoolTimeout):
            error = StoreUnavailable(f"PostgreSQL at {self.where}: no connection within {self.timeout_s:g} s "
                                     "(server unreachable?)")
        elif isinstance(e, psycopg.OperationalError) and e.sqlstate not in RETRY_SQLSTATES:
            error = StoreUnavailable(f"PostgreSQL at {self.where}: {self._message(e)}")
        else:
            return StoreError(f"PostgreSQL at {self.where}: {self._message(e)}")
        if e.sqlstate == QUERY_CANCELED:    # statement_timeout ended a slow statement: the server answers
            return StoreTimeout(str(error))
        self.health.failed(error)           # readiness: unavailable until a ping succeeds
        return error
