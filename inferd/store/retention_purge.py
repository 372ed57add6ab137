"""Deleting rows kept under a tenant's retention period (transcripts, stored responses), in batches.

A table purged here has `seq` (its row order), `tenant`, `created_at` and `expires_at` columns. Rows go
when the expiry they were written with has passed and, given `retention_of(tenant)` (seconds; 0 for
"none"), when they are older than the tenant's period now, so a shortened period or a tenant back on
"none" takes effect at the next pass. Batches keep the store's single writer from being held for long.
"""
from __future__ import annotations

from collections.abc import Callable

from inferd.store.db import Database

PURGE_BATCH = 1000                  # rows per DELETE


async def purge_expired(db: Database, table: str, now: float,
                        retention_of: Callable[[str], float] | None = None) -> int:
    """Delete `table`'s rows past their period (see the module docstring); how many went."""
    gone = await _delete_batched(db, table, "expires_at <= ?", (now,))
    if retention_of is not None:
        for (tenant,) in await db.query(f"SELECT DISTINCT tenant FROM {table}"):
            gone += await _delete_batched(db, table, "tenant = ? AND created_at <= ?",
                                          (tenant, now - retention_of(tenant)))
    return gone


async def _delete_batched(db: Database, table: str, where: str, params: tuple) -> int:
    total = 0
    while True:
        n = await db.execute(f"DELETE FROM {table} WHERE seq IN (SELECT seq FROM {table} WHERE {where} "
                             f"LIMIT {PURGE_BATCH})", params)
        total += n
        if n < PURGE_BATCH:
            return total
