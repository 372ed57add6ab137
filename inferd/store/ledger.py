"""The usage ledger: one row per finished request (success or not), what billing reads.

A row is recorded when its request ends, and the response's last bytes go out only once it is
committed (inferd.api), so a response the client received completely is in the ledger after a crash.
Streams the client abandoned are recorded with the tokens actually generated (billed partially).
"""
from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from typing import Any

import msgspec

from inferd.store.db import Database, StoreError, StoreTimeout, StoreUnavailable


class LedgerRow(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    tenant: str
    key_id: str | None
    model: str
    version: str
    node: str                    # the node that served it (cluster node id, or the host name alone)
    endpoint: str                # "completions" | "chat.completions" | "batch"
    stream: bool
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    status: int                  # the HTTP status the client got (499: it left)
    finish_reason: str | None
    queue_s: float | None        # arrival -> first engine step
    prefill_s: float | None      # first step -> first token
    decode_s: float | None       # first token -> last
    total_s: float               # arrival -> end of the response
    cost: float                  # from [prices] at the time (0 when the model has no price)
    finished_at: float           # unix seconds


class UsageFilter(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str | None = None
    model: str | None = None
    since: float | None = None   # unix seconds, inclusive
    until: float | None = None   # unix seconds, exclusive


class UsageTotal(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    tenant: str
    model: str
    version: str | None = None   # totals by version only: each version's (a precision tier's) cost apart
    day: str                     # UTC, YYYY-MM-DD
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost: float



_COLUMNS = tuple(LedgerRow.__struct_fields__)
_INSERT = (f"INSERT INTO ledger ({', '.join(_COLUMNS)}, day) "
           f"VALUES ({', '.join('?' * (len(_COLUMNS) + 1))})")
_SELECT_ROWS = f"SELECT seq, {', '.join(_COLUMNS)} FROM ledger"
_STREAM = _COLUMNS.index("stream")     # stored as BIGINT 0/1
_MAX_BATCH = 200         # rows per execute_many: the callers one commit wakes at once (a burst on the loop)


def utc_day(ts: float) -> str:
    """Unix seconds -> 'YYYY-MM-DD' in UTC (stored with the row, so totals group without SQL date functions)."""
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def _values(row: LedgerRow) -> tuple:
    values = [getattr(row, name) for name in _COLUMNS]
    values[_STREAM] = int(row.stream)
    return (*values, utc_day(row.finished_at))


def _where(f: UsageFilter, clauses: list[str] | None = None, params: list[Any] | None = None) -> tuple[str, list]:
    clauses, params = list(clauses or ()), list(params or ())
    for clause, value in (("tenant = ?", f.tenant), ("model = ?", f.model), ("finished_at >= ?", f.since),
                          ("finished_at < ?", f.until)):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    return (f" WHERE {' AND '.join(clauses)}" if clauses else ""), params


class Ledger:
    """Loop thread only.

    Concurrent `record` calls are gathered on the loop into one `execute_many` (at most one in flight; the
    rows recorded meanwhile form the next), so many requests ending together cost one statement and share
    one commit. If a batch fails for a reason of its own rows, each row is retried alone so that only a
    bad row fails its caller; a StoreUnavailable (disk full, server gone) fails the batch's callers and
    starts an outage (`unavailable_for`) that the next successful commit ends. A StoreTimeout (a slow
    store) fails the batch's callers but starts no outage; a batch whose COMMIT was under way when it
    timed out waits for that COMMIT's outcome, so a caller told "not recorded" (a response withheld as
    503) never has its row committed, and one whose row committed is told so.
    """

    def __init__(self, db: Database, *, unavailable_retry_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._db = db
        self._queued: list[tuple[tuple, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self.unavailable_retry_s = unavailable_retry_s
        self._clock = clock
        self.failure: StoreUnavailable | None = None    # the last commit's, until one succeeds
        self._failed_at = 0.0

    def unavailable_for(self) -> float:
        """Seconds to keep refusing new requests after the last failed commit (0: let them through; one
        that fails again starts a new wait). A store that recovered is found by the request let through."""
        if self.failure is None:
            return 0.0
        return max(0.0, self._failed_at + self.unavailable_retry_s - self._clock())

    async def record(self, row: LedgerRow) -> None:
        """Committed when this returns (group commit: many concurrent calls share one commit)."""
        await self.enqueue(row)     # cancelling the caller does not withdraw the row: it is written all the same

    def enqueue(self, row: LedgerRow) -> asyncio.Future:
        """`row` queued for the next group commit; the future is done (None, or the store's error) once it is
        committed. What `record` does without a coroutine of its own: `asyncio.shield` of this future keeps a
        request's wait for its row from costing a task."""
        fut = asyncio.get_running_loop().create_future()
        self._queued.append((_values(row), fut))
        if self._flusher is None:
            # In an empty context: it commits every request's rows, so no one request's deadline bounds it.
            self._flusher = asyncio.create_task(self._flush(), name="inferd-ledger-flush",
                                                context=contextvars.Context())
        return fut

    async def _flush(self) -> None:
        try:
            while self._queued:
                batch, self._queued = self._queued[:_MAX_BATCH], self._queued[_MAX_BATCH:]
                try:
                    outcomes = await self._commit(batch)
                except BaseException as exc:        # cancelled (loop shutdown) or a bug: nobody waits forever
                    batch, self._queued = batch + self._queued, []
                    error = StoreUnavailable(f"{self._db.where}: ledger write interrupted ({exc!r})")
                    _settle(batch, [error] * len(batch))
                    raise
                _settle(batch, outcomes)
        finally:
            self._flusher = None

    async def _commit(self, batch: list[tuple[tuple, asyncio.Future]]) -> list[BaseException | None]:
        """Write a batch; each row's outcome (None: committed)."""
        error = await self._write([values for values, _ in batch])
        if error is None:
            self.failure = None
            return [None] * len(batch)
        if isinstance(error, StoreUnavailable):
            if not isinstance(error, StoreTimeout):     # slowness is not an outage: the ping finds a dead store
                self.failure, self._failed_at = error, self._clock()
            return [error] * len(batch)
        # One at a time, in order, to find the row at fault: the others commit, in recording order.
        return [await self._write([values]) for values, _ in batch]

    async def _write(self, rows: list[tuple]) -> BaseException | None:
        try:
            await self._db.execute_many(_INSERT, rows, ordered=True)
        except StoreTimeout as exc:
            return await _outcome(exc)
        except StoreError as exc:
            return exc
        return None

    async def totals(self, f: UsageFilter, *, by_version: bool = False) -> list[UsageTotal]:
        """Per tenant, model (and version, `by_version`) and UTC day, ordered by day, tenant, model, version."""
        where, params = _where(f)
        group = "day, tenant, model, version" if by_version else "day, tenant, model, NULL"
        found = await self._db.query(
            f"SELECT {group}, COUNT(*), SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens), "
            f"SUM(cost) FROM ledger{where} GROUP BY {group.removesuffix(', NULL')}", params)
        totals = [UsageTotal(day=day, tenant=tenant, model=model, version=version, requests=int(n),
                             prompt_tokens=int(p), cached_tokens=int(c), completion_tokens=int(g), cost=float(cost))
                  for day, tenant, model, version, n, p, c, g, cost in found]
        # sorted here, not by ORDER BY: PostgreSQL's collation may order text differently from SQLite's
        return sorted(totals, key=lambda t: (t.day, t.tenant, t.model, t.version or ""))

    async def rows(self, f: UsageFilter, *, limit: int = 1000, after: int = 0) -> list[tuple[int, LedgerRow]]:
        """(sequence number, row) in recording order, after sequence `after` (paging for export)."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        where, params = _where(f, ["seq > ?"], [after])
        found = await self._db.query(f"{_SELECT_ROWS}{where} ORDER BY seq LIMIT ?", [*params, limit])
        return [(int(seq), _row(values)) for seq, *values in found]

    async def spent(self, tenant: str, since: float, node: str | None = None) -> tuple[float, int]:
        """(cost, prompt + completion tokens) of the tenant's rows finished at or after `since` (those
        `node` served, when given: in a cluster each node adds its peers' reported spend to its own)."""
        where, params = "WHERE tenant = ? AND finished_at >= ?", [tenant, since]
        if node is not None:
            where, params = where + " AND node = ?", [*params, node]
        found = await self._db.query(
            "SELECT COALESCE(SUM(cost), 0), COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM ledger "
            + where, params)
        cost, tokens = found[0]
        return float(cost), int(tokens)


def _row(values: list) -> LedgerRow:
    fields = dict(zip(_COLUMNS, values))
    fields["stream"] = bool(fields["stream"])
    return LedgerRow(**fields)


async def _outcome(exc: StoreTimeout) -> BaseException | None:
    """What became of a write that timed out: None if it committed after all, else why not."""
    if exc.pending is None:
        return exc              # withdrawn or rolled back: never written
    await asyncio.wait([exc.pending])
    if exc.pending.cancelled():
        return exc
    return exc.pending.exception()


def _settle(batch: list[tuple[tuple, asyncio.Future]], outcomes: list[BaseException | None]) -> None:
    for (_, fut), outcome in zip(batch, outcomes):
        if fut.done():
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(None)
