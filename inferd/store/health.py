"""The store's health check: a ping every `[store] ping_interval_s`, each bounded by `ping_timeout_s`.

A failed ping (or a write that fails for the store's sake, marked where it fails) makes `Database.health`
unavailable, and /readyz answers 503 `store_unavailable` until a ping succeeds again, so a load balancer
stops sending traffic within one probe interval of an outage and resumes when the store is back.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from inferd.observability import get_logger
from inferd.store.db import REQUEST_DEADLINE, Database, StoreError

log = get_logger("inferd.store")


async def ping_once(db: Database, timeout_s: float) -> None:
    """One ping; its outcome recorded in `db.health` (a change logged)."""
    try:
        await asyncio.wait_for(db.ping(timeout_s), timeout_s + 0.5)   # the backend bounds itself: a backstop
    except (StoreError, asyncio.TimeoutError) as exc:
        error = str(exc) or f"{db.where}: ping: no answer within {timeout_s} s"
        if db.health.ok:
            log.error("store_unavailable", where=db.where, error=error)
        db.health.failed(error)
        return
    if not db.health.ok:
        log.info("store_recovered", where=db.where, message=f"was unavailable: {db.health.failure}")
    db.health.recovered()


async def ping_forever(db: Database, interval_s: float, timeout_s: float) -> None:
    REQUEST_DEADLINE.set(None)
    while True:
        await ping_once(db, timeout_s)
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def pinging(db: Database, interval_s: float, timeout_s: float) -> AsyncIterator[None]:
    """Ping `db` in the background while the block runs."""
    task = asyncio.create_task(ping_forever(db, interval_s, timeout_s), name="inferd-store-ping")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
