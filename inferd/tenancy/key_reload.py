"""Keys take effect on a running daemon without SIGHUP: a 1 s poll of the keys file's stamp.

`inferd keys create|revoke` replace the file atomically (inferd.tenancy.keys_file), so each poll sees
the old file or the new one. The poll is one `stat` (inode, mtime, size) off the loop; only a changed
stamp reads and parses the file, also off the loop, and swaps the records in (a file rewritten in
place waits until its stamp holds for one poll, so a poll mid-write never applies half a file; see
KeyStore.reread). The poll runs every KEYS_POLL_INTERVAL_S; SIGHUP re-reads at once. A malformed file keeps
the keys in effect: it is logged (`keys_reload_failed`), counted and audited once per distinct file,
not once per poll.

Every re-read goes through `KeyReloader.reload` under one lock (the poll, SIGHUP, `refresh_keys`), so
an older read never lands after a newer one. Each applied change is one audit record per key, by key
id (never the secret or its hash): `key.create`, `key.revoke`, `key.remove` (the line is gone),
`key.update` (tenant, scopes or hash rewritten); a failure is `keys.reload_failed`.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from inferd.observability import SYSTEM_ACTOR, get_logger
from inferd.tenancy.keys import KeyStore
from inferd.tenancy.keys_file import KeyFileError, KeyFileUnchanged, KeyRecord

log = get_logger("inferd.tenancy.keys")

KEYS_POLL_INTERVAL_S = 1.0            # read when each poll starts, so tests may shorten it


class AuditSink(Protocol):
    def append(self, actor: str, action: str, **fields: Any) -> int: ...


class KeyChanges(msgspec.Struct, frozen=True):
    added: tuple[KeyRecord, ...] = ()
    revoked: tuple[KeyRecord, ...] = ()
    removed: tuple[KeyRecord, ...] = ()
    updated: tuple[KeyRecord, ...] = ()      # tenant, scopes or hash changed in place, or un-revoked

    def __bool__(self) -> bool:
        return bool(self.added or self.revoked or self.removed or self.updated)

    def summary(self) -> dict[str, list[str]]:
        return {kind: [r.key_id for r in getattr(self, kind)]
                for kind in ("added", "revoked", "removed", "updated") if getattr(self, kind)}


def diff_records(old: dict[str, KeyRecord], new: dict[str, KeyRecord]) -> KeyChanges:
    added, revoked, updated = [], [], []
    for key_id, record in new.items():
        before = old.get(key_id)
        if before is None:
            added.append(record)
        elif before.revoked_at is None and record.revoked_at is not None \
                and msgspec.structs.replace(record, revoked_at=None) == before:
            revoked.append(record)
        elif record != before:
            updated.append(record)
    removed = [r for key_id, r in old.items() if key_id not in new]
    return KeyChanges(tuple(added), tuple(revoked), tuple(removed), tuple(updated))


def _public(record: KeyRecord) -> dict[str, Any]:
    """What an audit record may say about a key: never the secret, nor its hash."""
    return {"tenant": record.tenant, "scopes": list(record.scopes),
            "status": "active" if record.revoked_at is None else "revoked"}


class KeyReloader:
    """The one owner of re-reading the keys file of `store_of()` (None while auth is off)."""

    def __init__(self, store_of: Callable[[], KeyStore | None], *, interval_s: float | None = None,
                 audit: AuditSink | None = None) -> None:
        self._store_of = store_of
        self.interval_s = interval_s              # None: KEYS_POLL_INTERVAL_S
        self.audit = audit
        self.counts = {"success": 0, "error": 0}   # applied changes; newly seen malformed files
        self.generation = 0                         # bumped after each applied change or new failure
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    # -- the poll ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start polling (needs the running loop). Idempotent."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll(), name="inferd-keys-poll")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s or KEYS_POLL_INTERVAL_S)
            try:
                await self.reload("keys file changed", quiet=True, settle=True)
            except KeyFileError:
                pass                      # logged, counted and audited by reload; the old keys stay
            except Exception as exc:  # noqa: BLE001 - the poll must outlive any one bad read
                log.error("keys_poll_failed", error=str(exc), error_type=type(exc).__name__)

    # -- re-reading --------------------------------------------------------------------------
    async def reload(self, reason: str, *, quiet: bool = False, settle: bool = False) -> KeyChanges | None:
        """Re-read the file if it changed and apply it; None if unchanged. A malformed file raises
        KeyFileError and the old keys stay; the same malformed file again raises KeyFileUnchanged
        (not counted twice), or with `quiet` returns None. `settle`: see KeyStore.reread."""
        async with self._lock:
            store = self._store_of()
            if store is None:
                return None
            try:
                swapped = await asyncio.to_thread(store.reread, settle=settle)
            except KeyFileUnchanged:
                if quiet:
                    return None
                raise
            except KeyFileError as exc:
                self.counts["error"] += 1
                log.error("keys_reload_failed", path=str(store.path), error=str(exc), reason=reason,
                          message="the previous keys stay in effect")
                self._record(SYSTEM_ACTOR, "keys.reload_failed", target=store.path.name, reason=reason,
                             detail={"error": str(exc)})
                self._bump()
                raise
            if swapped is None:
                return None
            return self._applied(diff_records(*swapped), reason)

    def replaced(self, old: KeyStore | None, new: KeyStore | None, reason: str) -> KeyChanges:
        """A new authenticator (a changed [auth] table) took over: audit the keys it changed."""
        before = old.records() if old is not None else {}
        after = new.records() if new is not None else {}
        return self._applied(diff_records(before, after), reason)

    def _applied(self, changes: KeyChanges, reason: str) -> KeyChanges:
        if changes:
            self.counts["success"] += 1
            log.info("keys_reloaded", reason=reason, **changes.summary())
            for r in changes.added:
                self._record(SYSTEM_ACTOR, "key.create", target=r.key_id, after=_public(r), reason=reason)
            for r in changes.revoked:
                self._record(SYSTEM_ACTOR, "key.revoke", target=r.key_id, before={**_public(r), "status": "active"},
                             after=_public(r), reason=reason, detail={"revoked_at": r.revoked_at})
            for r in changes.removed:
                self._record(SYSTEM_ACTOR, "key.remove", target=r.key_id, before=_public(r), reason=reason)
            for r in changes.updated:
                self._record(SYSTEM_ACTOR, "key.update", target=r.key_id, after=_public(r), reason=reason)
        self._bump()
        return changes

    def _record(self, actor: str, action: str, **fields: Any) -> None:
        if self.audit is None:
            return
        try:
            self.audit.append(actor, action, **fields)
        except Exception as exc:  # noqa: BLE001 - a closed or failing audit log must not undo a key change
            log.error("audit_append_failed", action=action, error=str(exc))

    # -- waiting (tests, and anyone who must know a change is live) -------------------------
    def _bump(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, after: int) -> int:
        """Wait until `generation` exceeds `after` (a change applied or a new failure); returns it."""
        while self.generation <= after:
            await self._changed.wait()
        return self.generation
