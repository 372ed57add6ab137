"""Stored responses of the Responses API (`store: true`): the response as its client got it, and the
conversation it ends, which a later request's `previous_response_id` continues.

Kept per tenant (another tenant's id reads as absent) until `expires_at`, its creation plus the tenant's
retention period; `purge` deletes what has expired, and what is older than a tenant's period now, as
transcripts are purged (docs/privacy.md). Writes go through the Database's writer, off the loop, and are
committed when `put` returns: a client that has the response can continue it at once, on any node that
shares the store, and after a restart.
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from inferd.store.db import Database

PURGE_BATCH = 1000                  # rows per DELETE


class StoredConversation(msgspec.Struct, frozen=True, kw_only=True):
    id: str                             # "resp_..."
    tenant: str
    model: str
    created_at: float
    expires_at: float
    previous_response_id: str | None
    # JSON text (orjson escapes NUL, which PostgreSQL text cannot hold); its size is bounded by the
    # model's context, which the conversation had to fit
    response: str                       # the Response object, JSON
    conversation: str                   # the chat messages up to and including this response's output, JSON


_COLUMNS = ("id", "tenant", "model", "created_at", "expires_at", "previous_response_id", "response", "conversation")


class ResponseStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def put(self, r: StoredConversation) -> None:
        """Store `r` (committed when this returns)."""
        await self._db.execute(
            f"INSERT INTO responses ({', '.join(_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (r.id, r.tenant, r.model, r.created_at, r.expires_at, r.previous_response_id, r.response,
             r.conversation))

    async def get(self, tenant: str, response_id: str, now: float) -> StoredConversation | None:
        """`tenant`'s response `response_id` if it is still kept (None: unknown, expired, or another tenant's)."""
        rows = await self._db.query(
            f"SELECT {', '.join(_COLUMNS)} FROM responses WHERE id = ? AND tenant = ? AND expires_at > ?",
            (response_id, tenant, now))
        return StoredConversation(**dict(zip(_COLUMNS, rows[0]))) if rows else None

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Delete `tenant`'s response `response_id`; whether there was one."""
        return await self._db.execute("DELETE FROM responses WHERE id = ? AND tenant = ?", (response_id, tenant)) > 0

    async def purge(self, now: float, *, retention_of: Callable[[str], float] | None = None) -> int:
        """Delete responses whose period has ended; with `retention_of(tenant)` (seconds, 0 = "none") also
        those older than the tenant's period now. How many went."""
        gone = await self._delete_batched("expires_at <= ?", (now,))
        if retention_of is not None:
            for (tenant,) in await self._db.query("SELECT DISTINCT tenant FROM responses"):
                gone += await self._delete_batched("tenant = ? AND created_at <= ?",
                                                   (tenant, now - retention_of(tenant)))
        return gone

    async def _delete_batched(self, where: str, params: tuple) -> int:
        total = 0
        while True:
            n = await self._db.execute(f"DELETE FROM responses WHERE seq IN (SELECT seq FROM responses WHERE "
                                       f"{where} LIMIT {PURGE_BATCH})", params)
            total += n
            if n < PURGE_BATCH:
                return total

