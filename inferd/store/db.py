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

Every call is bounded in time: a caller waits at most `call_timeout()`, the store's `timeout_s` or, inside a
request, what is left of the request's deadline (REQUEST_DEADLINE, set by the pipeline once the deadline
is known) less a margin, so a store that hangs fails the request with StoreUnavailable (503
store_unavailable) before its deadline instead of holding it. A contextvar rather than a parameter: the
repositories and their call sites stay as they are, and a task started by a request inherits its bound
(a task shared by many requests, like the ledger's group commit, starts in an empty context instead).
A call that times out raises StoreTimeout, and the write it made is then settled: withdrawn before it
ran or rolled back (`pending` None), or, when its COMMIT was already under way, its outcome awaited a
little longer and otherwise left to the caller (`pending`), so a caller told "not written" never finds
the write committed later.
`health` says whether the store answers (inferd.store.health pings it; a failed write marks it): /readyz
turns 503 while it does not.
"""
from __future__ import annotations

import abc
import asyncio
import contextvars
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec

COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DEADLINE_MARGIN_S = 0.25    # a store call gives up this long before its request's deadline: time to answer 503
MIN_CALL_S = 1.0            # ... but gets at least this long: a request past its deadline still records its row

# The deadline (time.monotonic()) of the request this task serves, None outside requests.
REQUEST_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("inferd_request_deadline",
                                                                                default=None)


class StoreError(Exception):
    """The store cannot do what was asked; the message names the file or server and what is wrong."""


class StoreCorrupt(StoreError):
    """The database file fails its integrity check (or is not a database): refuse to start, never start empty."""


class StoreLocked(StoreError):
    """Another process holds the database (a second daemon on the same state directory)."""


class StoreUnavailable(StoreError):
    """A write or read failed for a reason outside the request: disk full, I/O error, server gone."""


class StoreTimeout(StoreUnavailable):
    """A call got no answer within its bound: the store is slow, not known to be down, so it neither
    marks the store unhealthy nor starts a ledger outage (a ping finds a dead store).

    `pending`: None when the write did not happen and never will (withdrawn or cancelled before its
    COMMIT); else an awaitable that ends once its outcome is known (its COMMIT was under way when the
    caller's bound ran out): its result if it committed, its error if not. Reads always have None."""

    def __init__(self, message: str, pending: "asyncio.Future | None" = None) -> None:
        super().__init__(message)
        self.pending = pending


class StoreHealth:
    """Whether the store answers: failed by a failed ping or a write that failed for the store's sake
    (StoreUnavailable), healthy again only when a ping succeeds (a write that succeeds proves little: on a
    full disk small writes may still fit). Loop thread only."""

    def __init__(self) -> None:
        self.failure: str | None = None     # why it is unavailable; None: healthy
        self.since = 0.0                    # time.monotonic() of the first failure of this outage
        self._down: asyncio.Event | None = None     # set when it fails (made on first wait: loop-bound)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def failed(self, error: BaseException | str) -> None:
        if self.failure is None:
            self.since = time.monotonic()
            if self._down is not None:
                self._down.set()
        self.failure = str(error)

    def recovered(self) -> None:
        if self.failure is not None:    # (every successful ping calls this: waiters keep their event)
            self.failure = None
            self._down = None           # the old one is set: the next outage needs a fresh one

    async def wait_failed(self) -> None:
        """Return when the store is found unavailable (at once if it is now)."""
        if self.failure is None:
            if self._down is None:
                self._down = asyncio.Event()
            await self._down.wait()


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
    timeout_s: float = 5.0          # the longest any call waits (inside a request: less, see call_timeout)

    @property
    def health(self) -> StoreHealth:
        health = self.__dict__.get("_health")
        if health is None:
            health = self.__dict__["_health"] = StoreHealth()
        return health

    def call_timeout(self) -> float:
        """How long the call being made may take: `timeout_s`, or less inside a request whose deadline
        is nearer or while the store is unhealthy (never under MIN_CALL_S, nor over `timeout_s`)."""
        # A store known to be down (until a ping succeeds) fails its callers fast: a call queued behind
        # another (the ledger's next group) does not wait a whole timeout again.
        bound = self.timeout_s if self.health.ok else min(self.timeout_s, MIN_CALL_S)
        deadline = REQUEST_DEADLINE.get()
        if deadline is None:
            return bound
        return min(bound, max(MIN_CALL_S, deadline - time.monotonic() - DEADLINE_MARGIN_S))

    def timed_out(self, what: str, seconds: float, pending: "asyncio.Future | None" = None) -> StoreTimeout:
        """The error of a call that got no answer in `seconds`. It does not mark the store down: a slow
        statement (a large usage export) is not a dead server, and the ping finds one of those."""
        unknown = "" if pending is None else " (its commit was under way: the outcome is not known yet)"
        return StoreTimeout(f"{self.where}: {what}: no answer within {seconds:.2f} s{unknown}", pending)

    async def ping(self, timeout: float) -> None:
        """Raise StoreUnavailable unless the store answers within `timeout` (and can take writes, where
        the backend can tell)."""
        await self.query("SELECT 1")

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
