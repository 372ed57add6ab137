"""Transcripts: the text of a tenant's requests, for tenants whose retention allows keeping it.

A tenant's `retention` is "none" by default: nothing of its prompts or completions is written
anywhere. With a period ("7d", "12h") each finished request's prompt and completion text is kept
here until `expires_at` (its end plus the period), and `purge` deletes what has expired (the daemon
runs it every minute; docs/privacy.md). Writes go through the Database's writer, off the loop.
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from inferd.store.db import Database
from inferd.store.retention_purge import purge_expired

MAX_TEXT_CHARS = 1_000_000          # one side of one request: a bound on what a debugging record keeps


class Transcript(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    tenant: str
    model: str
    created_at: float
    expires_at: float
    prompt: str
    completion: str


class Transcripts:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def record(self, t: Transcript) -> None:
        await self._db.execute_many(
            "INSERT INTO transcripts (request_id, tenant, model, created_at, expires_at, prompt, completion) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(t.request_id, t.tenant, t.model, t.created_at, t.expires_at, _text(t.prompt), _text(t.completion))])

    async def purge(self, now: float, *, retention_of: Callable[[str], float] | None = None) -> int:
        """Delete transcripts past their period (inferd.store.retention_purge); how many went."""
        return await purge_expired(self._db, "transcripts", now, retention_of)

    async def for_tenant(self, tenant: str, now: float, limit: int = 100) -> list[Transcript]:
        """The tenant's transcripts still within retention, newest first."""
        rows = await self._db.query(
            "SELECT request_id, tenant, model, created_at, expires_at, prompt, completion FROM transcripts "
            "WHERE tenant = ? AND expires_at > ? ORDER BY seq DESC LIMIT ?", (tenant, now, limit))
        fields = ("request_id", "tenant", "model", "created_at", "expires_at", "prompt", "completion")
        return [Transcript(**dict(zip(fields, row))) for row in rows]


def _text(value: str) -> str:
    """Bounded, and without NUL (PostgreSQL text cannot hold it)."""
    return value[:MAX_TEXT_CHARS].replace("\x00", "\ufffd")
