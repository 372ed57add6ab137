"""Idempotency-Key records (the IETF httpapi idempotency-key draft), per tenant, in the store.

The API claims a key before running a request: the first claim wins and holds it while the request
runs (until `hold_s`, after which a crashed holder's claim may be taken over); a finished request's
response is stored for `ttl_s`. A later claim of the same key then gets that response (replayed), a
409 while it is still running, or a 422 when its body differs (a different SHA-256).

A claim's owner names the process that holds it (inferd.store.owner: "node/pid/start/request id"), so a
daemon starting on a node releases the claims its crashed predecessor there left running
(`release_dead`), and a retry runs at once rather than after the hold.
"""
from __future__ import annotations

from typing import Literal

import msgspec

from inferd.store import owner as owners
from inferd.store.db import Database, StoreError


class StoredResponse(msgspec.Struct, frozen=True, kw_only=True):
    status: int
    headers: dict[str, str]
    body: bytes                  # the JSON body; for a stream, the SSE bytes as sent
    stream: bool


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Literal["new", "in_flight", "done", "mismatch"]
    response: StoredResponse | None = None      # with "done"
    held_until: float | None = None             # with "in_flight": when its hold lapses (epoch seconds)


_CLAIM = (
    "INSERT INTO idempotency (tenant, idem_key, body_sha256, owner, state, held_until, expires_at) "
    "VALUES (?, ?, ?, ?, 'running', ?, ?) "
    "ON CONFLICT (tenant, idem_key) DO UPDATE SET body_sha256 = excluded.body_sha256, owner = excluded.owner, "
    "state = 'running', held_until = excluded.held_until, expires_at = excluded.expires_at, "
    "status = NULL, headers = NULL, body = NULL, stream = NULL "
    "WHERE idempotency.expires_at <= ? OR (idempotency.state = 'running' AND idempotency.held_until <= ?)")
_LOOKUP = ("SELECT body_sha256, state, status, headers, body, stream, held_until FROM idempotency "
           "WHERE tenant = ? AND idem_key = ?")
_FINISH = ("UPDATE idempotency SET state = 'done', status = ?, headers = ?, body = ?, stream = ?, "
           "held_until = ?, expires_at = ? WHERE tenant = ? AND idem_key = ? AND owner = ? AND state = 'running'")
_RELEASE = "DELETE FROM idempotency WHERE tenant = ? AND idem_key = ? AND owner = ? AND state = 'running'"
_PURGE = "DELETE FROM idempotency WHERE expires_at <= ?"
_ATTEMPTS = 5           # a claim that loses its row between the insert and the read (a purge, a release) retries


class IdempotencyStore:
    """Loop thread only. One row per (tenant, key): 'running' (held by `owner` until `held_until`) or
    'done' (the response). Both expire at `expires_at`: a claim's now + max(ttl_s, hold_s), a finished
    record's now + ttl_s. A claim is one upsert that replaces only an expired record or an unfinished
    one past its hold, so of concurrent claims (across processes and nodes too) exactly one wins."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def claim(self, tenant: str, key: str, body_sha256: bytes, owner: str, *, now: float, hold_s: float,
                    ttl_s: float) -> Claim:
        """Take the key for a request with this body (outcome "new": `owner` holds it until now + hold_s),
        or say what holds it. A record past its expiry (or an unfinished one past its hold) is replaced."""
        if not hold_s > 0 or not ttl_s > 0:
            raise ValueError(f"hold_s and ttl_s must be > 0, got {hold_s}, {ttl_s}")
        body_sha256 = bytes(body_sha256)
        params = (tenant, key, body_sha256, owner, now + hold_s, now + max(ttl_s, hold_s), now, now)
        for _ in range(_ATTEMPTS):
            if await self._db.execute(_CLAIM, params) == 1:
                return Claim(outcome="new")
            found = await self._db.query(_LOOKUP, (tenant, key))
            if not found:
                continue                # deleted since the insert lost: claim again
            stored_sha, state, status, headers, body, stream, held_until = found[0]
            if bytes(stored_sha) != body_sha256:
                return Claim(outcome="mismatch")
            if state != "done":
                return Claim(outcome="in_flight", held_until=float(held_until))
            response = StoredResponse(status=int(status), headers=msgspec.json.decode(headers, type=dict[str, str]),
                                      body=bytes(body), stream=bool(stream))
            return Claim(outcome="done", response=response)
        raise StoreError(f"{self._db.where}: idempotency key {key!r} of tenant {tenant!r} kept changing under "
                         f"{_ATTEMPTS} claims")

    async def finish(self, tenant: str, key: str, owner: str, response: StoredResponse, *, now: float,
                     ttl_s: float) -> None:
        """Store the response of the request `owner` ran; replays get it until now + ttl_s."""
        headers = msgspec.json.encode(response.headers).decode()
        await self._db.execute(_FINISH, (int(response.status), headers, bytes(response.body), int(response.stream),
                                         now, now + ttl_s, tenant, key, owner))

    async def release(self, tenant: str, key: str, owner: str) -> None:
        """The request ended with nothing worth replaying (refused before running, the client left):
        forget the claim so a retry runs it."""
        await self._db.execute(_RELEASE, (tenant, key, owner))

    async def purge_expired(self, now: float) -> int:
        """Delete expired records; how many."""
        return await self._db.execute(_PURGE, (now,))

    async def release_dead(self, node: str) -> int:
        """Delete the unfinished claims of processes on `node` (this one) that no longer run (a crash);
        how many. Finished records stay (their replays are good), as do other nodes' claims."""
        return await owners.release_dead(self._db, node, table="idempotency", column="owner",
                                         condition="state = 'running'")
