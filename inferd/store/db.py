"""The durable store's one seam: a SQL database with group-committed writes, behind one small interface.

Repositories (inferd.store.ledger, inferd.store.idempotency, ...) write portable SQL with `?`
placeholders and call `execute`, `execute_many`, `transaction` and `query`; the DDL of every table is
inferd.store.schema, per dialect. Two implementations:

- inferd.store.sqlite.SqliteDatabase: one file in the state directory, WAL mode, one writer thread
  fed by a bounded queue that commits in groups (every `commit_interval_ms` or `commit_rows`), reads on
  their own connection in a thread: never on the event loop.
- inferd.store.postgres.PostgresDatabase: psycopg 3 (async), the shared store of a cluster.

The promise every write makes: when `execute` / `execute_many` / `transaction` returns, the write is
committed (SQLite: survives a killed process with synchronous=normal, power loss too with "full").
A write that fails (a constraint, a full disk) raises in its own caller only; the others of its group
commit. Past `max_pending_writes` queued, writers wait for room (backpressure); nothing is dropped.
"""
from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from typing import Any

import msgspec

COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class StoreError(Exception):
    """The store cannot do what was asked; the message names the file or server and what is wrong."""


class StoreCorrupt(StoreError):
    """The database file fails its integrity check (or is not a database): refuse to start, never start empty."""


class StoreLocked(StoreError):
    """Another process holds the database (a second daemon on the same state directory)."""


class StoreUnavailable(StoreError):
    """A write or read failed for a reason outside the request: disk full, I/O error, server gone."""


class DbStats(msgspec.Struct, kw_only=True):
    """Counters for the metrics (read at scrape time)."""

    pending_writes: int = 0          # queued, not committed yet
    rows_written: int = 0            # statements (rows of execute_many) committed
    commits: int = 0
    commit_seconds_sum: float = 0.0
    commit_buckets: dict[float, int] = msgspec.field(default_factory=lambda: dict.fromkeys(COMMIT_BUCKETS, 0))
    # ^ cumulative: commits taking at most each COMMIT_BUCKETS bound
    errors: int = 0


class Counters:
    """A store's write statistics, updated once per commit (under a lock: SQLite's writer thread
    updates them) and read at scrape time as DbStats."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows = self.commits = self.errors = 0
        self.seconds = 0.0
        self.buckets = [0] * len(COMMIT_BUCKETS)

    def record(self, rows: int, errors: int, seconds: float | None) -> None:
        """`rows` committed by one commit that took `seconds` (None: no commit), `errors` writes failed."""
        with self.lock:
            self.rows += rows
            self.errors += errors
            if seconds is not None:
                self.commits += 1
                self.seconds += seconds
                for i, bound in enumerate(COMMIT_BUCKETS):
                    if seconds <= bound:
                        self.buckets[i] += 1

    def snapshot(self, pending_writes: int) -> DbStats:
        with self.lock:
            return DbStats(pending_writes=pending_writes, rows_written=self.rows, commits=self.commits,
                           commit_seconds_sum=self.seconds, commit_buckets=dict(zip(COMMIT_BUCKETS, self.buckets)),
                           errors=self.errors)


class Database(abc.ABC):
    """SQL with `?` placeholders. Loop thread only (the work happens off it)."""

    dialect: str        # "sqlite" | "postgres"
    where: str          # the file path or the server, for messages

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect, check integrity (StoreCorrupt), take the writer role (StoreLocked), create or
        upgrade the tables (inferd.store.schema)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Commit everything queued, then close. Idempotent."""

    @abc.abstractmethod
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One write, committed when this returns; its rowcount."""

    @abc.abstractmethod
    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]], *, ordered: bool = False) -> None:
        """One statement over many rows (the ledger's inserts), committed when this returns.

        `ordered`: rows that take sequence numbers become visible in that order relative to every other
        ordered write, on every node, so a reader paging by sequence (a billing export) never passes a
        row that commits later. SQLite has one writer, so it is always so there; PostgreSQL serializes
        ordered writes under a transaction-scoped advisory lock."""

    @abc.abstractmethod
    async def transaction(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        """Several writes, all or none, committed when this returns; their rowcounts."""

    @abc.abstractmethod
    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Rows of a read (of committed data)."""

    @abc.abstractmethod
    def stats(self) -> DbStats:
        """Counters as of now."""
