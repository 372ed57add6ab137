"""Batches of the Batch API and their line results, with leases so one runner at a time works on a batch.

Status: validating -> in_progress -> finalizing -> completed, or failed (the input is unusable), expired
(past expires_at), cancelling -> cancelled. A runner (inferd.jobs.batch_runner) takes a batch with
`acquire`: an UPDATE that succeeds only while the lease is free or expired, checked by its rowcount, so of
several runners (processes, or nodes sharing PostgreSQL) exactly one gets it. It renews the lease while it
works; a runner that dies leaves the lease to expire and another takes the batch over, or, when the
daemon restarts on the same node, has it released at the start (`release_dead`: the lease owner names
the runner's process, inferd.store.owner), so the batch resumes at once.

Each line's outcome is recorded once (`record`: INSERT ... ON CONFLICT DO NOTHING on (batch_id, idx)) as
soon as it is known, so a batch taken over runs only the lines not recorded yet. When the batch ends
(`finish`), its output and error files and its end state are written in one transaction, and the
recorded results, now in the files, are deleted; all of it only if the runner still holds the lease.
"""
from __future__ import annotations

import secrets
from collections.abc import Sequence

import msgspec

from inferd.store import owner as owners
from inferd.store.db import Database

BATCH_PREFIX = "batch_"
STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled")
RUNNABLE = ("validating", "in_progress", "finalizing", "cancelling")     # what a runner takes
ENDED = ("failed", "completed", "expired", "cancelled")
_RUNNABLE_SQL = "status IN ('validating', 'in_progress', 'finalizing', 'cancelling')"
_CANDIDATES = 16            # batches looked at per acquire (others may take some first)
_TIMES = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
          "cancelled_at")
_COLUMNS = ("id", "tenant", "endpoint", "input_file_id", "completion_window", "status", "created_at", *_TIMES,
            "expires_at", "total", "completed", "failed", "output_file_id", "error_file_id", "metadata", "errors",
            "lease_owner", "lease_until")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM batches"


class BatchError(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    code: str
    message: str
    line: int | None = None         # 1-based line of the input file
    param: str | None = None


class BatchRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    tenant: str
    endpoint: str                   # "/v1/chat/completions" | "/v1/completions"
    input_file_id: str
    completion_window: str
    status: str
    created_at: float
    expires_at: float
    total: int = 0
    completed: int = 0
    failed: int = 0
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    errors: list[BatchError] | None = None
    lease_owner: str | None = None
    lease_until: float | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def to_openai(self) -> dict:
        """OpenAI's Batch object."""
        out = {"id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": None,
               "input_file_id": self.input_file_id, "completion_window": self.completion_window,
               "status": self.status, "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
               "created_at": int(self.created_at), "expires_at": int(self.expires_at),
               "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
               "metadata": self.metadata}
        for name in _TIMES:
            value = getattr(self, name)
            out[name] = None if value is None else int(value)
        if self.errors:
            out["errors"] = {"object": "list", "data": [msgspec.to_builtins(e) for e in self.errors]}
        return out


class BatchResult(msgspec.Struct, frozen=True, kw_only=True):
    idx: int                        # 0-based line index in the input file
    custom_id: str
    ok: bool                        # True: a line of the output file; False: of the error file
    body: bytes                     # the JSON line to write (no newline)


def new_batch_id() -> str:
    return BATCH_PREFIX + secrets.token_hex(12)


def _record(row: tuple) -> BatchRecord:
    fields = dict(zip(_COLUMNS, row))
    for name in ("total", "completed", "failed"):
        fields[name] = int(fields[name])
    for name in ("created_at", "expires_at", "lease_until", *_TIMES):
        if fields[name] is not None:
            fields[name] = float(fields[name])
    fields["metadata"] = msgspec.json.decode(fields["metadata"], type=dict[str, str]) if fields["metadata"] else None
    fields["errors"] = msgspec.json.decode(fields["errors"], type=list[BatchError]) if fields["errors"] else None
    return BatchRecord(**fields)


class BatchStore:
    """Loop thread only; every write is committed when its call returns."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- what the API does -----------------------------------------------------------------------

    async def create(self, tenant: str, endpoint: str, input_file_id: str, completion_window: str, *,
                     total: int, metadata: dict[str, str] | None, now: float, window_s: float) -> BatchRecord:
        record = BatchRecord(id=new_batch_id(), tenant=tenant, endpoint=endpoint, input_file_id=input_file_id,
                             completion_window=completion_window, status="validating", created_at=now,
                             expires_at=now + window_s, total=total, metadata=metadata)
        await self._db.execute(
            "INSERT INTO batches (id, tenant, endpoint, input_file_id, completion_window, status, created_at, "
            "expires_at, total, completed, failed, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?)",
            (record.id, tenant, endpoint, input_file_id, completion_window, record.status, now, record.expires_at,
             total, msgspec.json.encode(metadata).decode() if metadata is not None else None))
        return record

    async def get(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """The tenant's batch, with its request counts as of now; None for another tenant's."""
        found = await self._db.query(f"{_SELECT} WHERE id = ? AND tenant = ?", (batch_id, tenant))
        return (await self._with_counts([_record(found[0])]))[0] if found else None

    async def load(self, batch_id: str, *, counts: bool = False) -> BatchRecord | None:
        """Any tenant's batch (the runner, the CLI); its request counts as of now with `counts`, else as
        stored (final once it ended)."""
        found = await self._db.query(f"{_SELECT} WHERE id = ?", (batch_id,))
        if not found:
            return None
        record = _record(found[0])
        return (await self._with_counts([record]))[0] if counts else record

    async def list(self, tenant: str | None, *, after: str | None = None, limit: int = 20) -> list[BatchRecord]:
        """The tenant's batches (None: every tenant's, for the CLI), newest first, after the batch `after` (an
        id from the previous page; one the tenant does not have gives an empty page)."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        clauses: list[str] = []
        params: list = []
        if tenant is not None:
            clauses.append("tenant = ?")
            params.append(tenant)
        if after is not None:
            mine = " AND tenant = ?" if tenant is not None else ""
            clauses.append(f"seq < (SELECT seq FROM batches WHERE id = ?{mine})")
            params += [after, tenant] if tenant is not None else [after]
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        found = await self._db.query(f"{_SELECT}{where} ORDER BY seq DESC LIMIT ?", [*params, limit])
        return await self._with_counts([_record(row) for row in found])

    async def request_cancel(self, tenant: str, batch_id: str, *, now: float) -> BatchRecord | None:
        """Mark a validating or in-progress batch `cancelling` (its runner stops starting lines and ends it
        `cancelled`); any other status is left as it is. The batch as it is now, None if the tenant has none."""
        await self._db.execute(
            "UPDATE batches SET status = 'cancelling', cancelling_at = ? "
            "WHERE id = ? AND tenant = ? AND status IN ('validating', 'in_progress')", (now, batch_id, tenant))
        return await self.get(tenant, batch_id)

    async def _with_counts(self, records: list[BatchRecord]) -> list[BatchRecord]:
        running = [r.id for r in records if r.status not in ENDED]
        if not running:
            return records
        found = await self._db.query(
            f"SELECT batch_id, ok, COUNT(*) FROM batch_results WHERE batch_id IN ({', '.join('?' * len(running))}) "
            "GROUP BY batch_id, ok", running)
        counts: dict[str, list[int]] = {}
        for batch_id, ok, n in found:
            counts.setdefault(batch_id, [0, 0])[0 if int(ok) else 1] += int(n)
        return [msgspec.structs.replace(r, completed=counts[r.id][0], failed=counts[r.id][1]) if r.id in counts else r
                for r in records]

    # -- what the runner does --------------------------------------------------------------------

    async def acquire(self, owner: str, now: float, lease_s: float) -> BatchRecord | None:
        """Lease one runnable batch (oldest first) whose lease is free or expired, to `owner` until
        now + lease_s; None when there is none. Safe against other runners doing the same."""
        candidates = await self._db.query(
            f"SELECT id FROM batches WHERE {_RUNNABLE_SQL} AND (lease_owner IS NULL OR lease_until < ?) "
            "ORDER BY seq LIMIT ?", (now, _CANDIDATES))
        for (batch_id,) in candidates:
            taken = await self._db.execute(
                f"UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ? AND {_RUNNABLE_SQL} "
                "AND (lease_owner IS NULL OR lease_until < ?)", (owner, now + lease_s, batch_id, now))
            if taken == 1:
                return await self.load(batch_id)
        return None

    async def renew(self, batch_id: str, owner: str, now: float, lease_s: float) -> bool:
        """Extend `owner`'s lease; False when it no longer holds it (it expired and another took it)."""
        return await self._db.execute("UPDATE batches SET lease_until = ? WHERE id = ? AND lease_owner = ?",
                                      (now + lease_s, batch_id, owner)) == 1

    async def release(self, batch_id: str, owner: str) -> None:
        await self._db.execute("UPDATE batches SET lease_owner = NULL, lease_until = NULL "
                               "WHERE id = ? AND lease_owner = ?", (batch_id, owner))

    async def release_dead(self, node: str) -> int:
        """Free the leases of runners on `node` (this one) whose process no longer runs (a crash), so this
        node's runner takes their batches now; how many. Other nodes' leases expire as they would."""
        return await owners.release_dead(self._db, node, table="batches", column="lease_owner",
                                         condition=_RUNNABLE_SQL, clear="lease_owner = NULL, lease_until = NULL")

    async def advance(self, batch_id: str, owner: str, from_status: str, to_status: str, *, now: float) -> bool:
        """validating -> in_progress, in_progress -> finalizing: False when the batch is no longer in
        `from_status` (cancelled meanwhile) or no longer `owner`'s."""
        if to_status not in ("in_progress", "finalizing"):
            raise ValueError(f"advance() goes to in_progress or finalizing, not {to_status!r}")
        return await self._db.execute(
            f"UPDATE batches SET status = ?, {to_status}_at = ? WHERE id = ? AND lease_owner = ? AND status = ?",
            (to_status, now, batch_id, owner, from_status)) == 1

    async def fail(self, batch_id: str, owner: str, errors: Sequence[BatchError], *, now: float) -> bool:
        """The batch cannot run (its input is gone or unusable): failed, with errors naming why."""
        text = msgspec.json.encode(list(errors)).decode()
        return await self._db.execute(
            "UPDATE batches SET status = 'failed', failed_at = ?, errors = ?, lease_owner = NULL, lease_until = NULL "
            f"WHERE id = ? AND lease_owner = ? AND {_RUNNABLE_SQL}", (now, text, batch_id, owner)) == 1

    async def record(self, batch_id: str, result: BatchResult) -> bool:
        """Record a line's outcome; False when that line was recorded already (the first one stays)."""
        return await self._db.execute(
            "INSERT INTO batch_results (batch_id, idx, custom_id, ok, body) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (batch_id, idx) DO NOTHING",
            (batch_id, result.idx, result.custom_id, int(result.ok), bytes(result.body))) == 1

    async def recorded(self, batch_id: str) -> set[int]:
        """Indexes of the lines recorded so far."""
        return {int(idx) for (idx,) in await self._db.query("SELECT idx FROM batch_results WHERE batch_id = ?",
                                                             (batch_id,))}

    async def results(self, batch_id: str) -> list[BatchResult]:
        found = await self._db.query("SELECT idx, custom_id, ok, body FROM batch_results WHERE batch_id = ? "
                                     "ORDER BY idx", (batch_id,))
        return [BatchResult(idx=int(i), custom_id=c, ok=bool(int(ok)), body=bytes(b)) for i, c, ok, b in found]

    async def finish(self, batch_id: str, owner: str, status: str, *, files: Sequence[tuple[str, Sequence]],
                     output_file_id: str | None, error_file_id: str | None, completed: int, failed: int,
                     now: float) -> bool:
        """End the batch `completed`, `cancelled` or `expired` if `owner` still holds it, in one transaction
        with `files` (the INSERTs of its output and error files, inferd.store.files.file_insert_statements), deleting
        its recorded results. False (and nothing written) when the batch is no longer `owner`'s to end."""
        if status not in ("completed", "cancelled", "expired"):
            raise ValueError(f"finish() ends a batch completed, cancelled or expired, not {status!r}")
        # The lease owner stays on the ended row: the later statements check that this very finish happened
        # (an UPDATE's rowcount cannot undo a transaction, a condition can).
        update = (f"UPDATE batches SET status = ?, {status}_at = ?, output_file_id = ?, error_file_id = ?, "
                  "completed = ?, failed = ?, lease_until = NULL "
                  f"WHERE id = ? AND lease_owner = ? AND {_RUNNABLE_SQL}",
                  (status, now, output_file_id, error_file_id, completed, failed, batch_id, owner))
        ended = "EXISTS (SELECT 1 FROM batches WHERE id = ? AND lease_owner = ? AND status = ?)"
        statements: list[tuple[str, Sequence]] = [update, *files]
        file_ids = [f for f in (output_file_id, error_file_id) if f is not None]
        if file_ids:
            marks = ", ".join("?" * len(file_ids))
            statements.append((f"DELETE FROM files WHERE id IN ({marks}) AND NOT {ended}",
                               (*file_ids, batch_id, owner, status)))
            statements.append((f"DELETE FROM file_chunks WHERE file_id IN ({marks}) AND NOT {ended}",
                               (*file_ids, batch_id, owner, status)))
        statements.append((f"DELETE FROM batch_results WHERE batch_id = ? AND {ended}", (batch_id, batch_id, owner,
                                                                                        status)))
        counts = await self._db.transaction(statements)
        return counts[0] == 1
