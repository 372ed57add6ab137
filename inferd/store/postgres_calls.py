"""How a PostgreSQL call is bounded in time (inferd.store.postgres): each runs in a task of its own, and the
caller waits for it at most call_timeout() (what is left of its request's deadline), or until a failed
ping finds the server gone.

A write is not left running when its caller gives up, since it could commit after its caller answered
"not written" (a 503, and an Idempotency-Key claim or a ledger row committed all the same):
- before its COMMIT is sent, the task is cancelled; psycopg then cancels the statement and the pool
  rolls the transaction back. A transaction whose COMMIT was never sent cannot commit, so the caller is
  told StoreTimeout (`pending` None) at once, without waiting for psycopg's cancel (slow when the
  server does not answer);
- once its COMMIT is under way it is not cancelled (the outcome would be unknown): the caller waits
  COMMIT_GRACE_S more for it, then gets StoreTimeout with `pending`, the task, to settle later.
A caller cancelled meanwhile (a client that left) leaves its write to run; a read is cancelled.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from inferd.store.db import StoreUnavailable

T = TypeVar("T")
COMMIT_GRACE_S = 1.0        # how long past its bound a caller waits for a COMMIT already sent


class Call:
    """One call's progress, read by its caller when its bound runs out."""

    __slots__ = ("committing",)

    def __init__(self) -> None:
        self.committing = False     # its COMMIT is sent: cancelling it would not roll it back for sure


class BoundedCalls:
    """PostgresDatabase's calls as bounded tasks (a mixin: it uses the store's counters, pool slots and
    health). Loop thread only."""

    def _spawn(self, work: Callable[[Any], Awaitable[T]], *, write: bool = False) -> asyncio.Task:
        """`work` in a task of its own, bounded by `timeout_s` (and a COMMIT under way by COMMIT_GRACE_S
        more) as a backstop: its caller normally cancels it or stops waiting sooner."""
        task = asyncio.ensure_future(self._bounded(work))
        self._tasks.add(task)
        task.add_done_callback(self._write_done if write else self._read_done)
        return task

    async def _bounded(self, work: Callable[[Any], Awaitable[T]]) -> T:
        try:
            return await asyncio.wait_for(self._run(work), self.timeout_s + COMMIT_GRACE_S)
        except asyncio.TimeoutError:        # (TimeoutError itself only from Python 3.11)
            self._counters.record(0, 1, None)
            raise self.timed_out("PostgreSQL", self.timeout_s + COMMIT_GRACE_S) from None

    async def _wait(self, task: asyncio.Task, call: Call, what: str) -> T:
        """The caller's wait for its call: over at call_timeout(), or as soon as the store is found
        unavailable meanwhile (a failed ping: the server stopped answering), rather than a whole
        timeout later. Then the call is settled as the module's docstring says before this raises."""
        bound = self.call_timeout()
        down = asyncio.ensure_future(self.health.wait_failed()) if self.health.ok else None
        try:
            await asyncio.wait([task] if down is None else [task, down], timeout=bound,
                               return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            if what == "read":      # its caller left: nobody wants the rows any more
                task.cancel()
            raise
        finally:
            if down is not None:
                down.cancel()
        if task.done():
            return task.result()
        if not call.committing:
            task.cancel()           # its transaction can only roll back now
            if down is not None and down.done() and not down.cancelled():
                raise StoreUnavailable(f"PostgreSQL at {self.where}: {what} given up: {self.health.failure}")
            raise self.timed_out(f"PostgreSQL {what}", bound)
        await asyncio.wait([task], timeout=COMMIT_GRACE_S)
        if task.done():
            return task.result()
        raise self.timed_out(f"PostgreSQL {what}", bound + COMMIT_GRACE_S, pending=task)

    def _read_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._leave()
        if not task.cancelled():
            task.exception()

    def _write_done(self, task: asyncio.Task) -> None:
        # Here, not in the write's `finally`: a task cancelled before its first step never runs that,
        # and close() would wait on _drained forever.
        self._tasks.discard(task)
        self._pending -= 1
        self._room.release()
        self._leave()
        if not task.cancelled():
            task.exception()        # retrieved: a failed write nobody waits for is counted in errors
