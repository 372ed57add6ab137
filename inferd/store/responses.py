"""Stored responses of the Responses API (`store: true`): the response as its client got it, and its own turn
(its input and output; the turns before it are the rows its `previous_response_id` links to), which a later
request's `previous_response_id` continues (inferd.api.pipeline.responses walks the links).

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
from inferd.store.retention_purge import purge_expired



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
    # JSON: {"turn": [chat messages of its input, then its output]}; a row written before rows kept only their
    # own turn holds a list, the whole conversation up to it
    conversation: str


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
        """Delete responses past their period (inferd.store.retention_purge); how many went."""
        return await purge_expired(self._db, "responses", now, retention_of)

