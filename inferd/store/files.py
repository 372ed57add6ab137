"""Files of the Batch API, per tenant: uploaded inputs (purpose "batch") and the output and error files
batches write (purpose "batch_output"). The content lives in the row, as a blob.

A tenant sees only its own files: another tenant's id is "not found" (None), exactly as an unknown one,
so ids cannot be probed across tenants.
"""
from __future__ import annotations

import secrets

import msgspec

from inferd.store.db import Database

FILE_PREFIX = "file-"
_COLUMNS = "id, tenant, purpose, filename, bytes, created_at, expires_at, status"
_INSERT = ("INSERT INTO files (id, tenant, purpose, filename, bytes, created_at, expires_at, status, content) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")


class FileRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    tenant: str
    purpose: str                # "batch" | "batch_output"
    filename: str
    bytes: int
    created_at: float           # unix seconds
    expires_at: float | None = None
    status: str = "processed"   # OpenAI's (deprecated) status: always "processed" once stored

    def to_openai(self) -> dict:
        """OpenAI's File object."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": int(self.created_at),
                "filename": self.filename, "purpose": self.purpose, "status": self.status,
                "expires_at": None if self.expires_at is None else int(self.expires_at), "status_details": None}


def new_file_id() -> str:
    return FILE_PREFIX + secrets.token_hex(12)


def file_insert_statement(tenant: str, purpose: str, filename: str, content: bytes, *, now: float,
                     expires_at: float | None = None) -> tuple[FileRecord, tuple[str, tuple]]:
    """The record and the INSERT creating it, for a caller that writes it in a transaction of its own
    (a batch's output files are written together with the batch's end, inferd.store.batches)."""
    record = FileRecord(id=new_file_id(), tenant=tenant, purpose=purpose, filename=filename, bytes=len(content),
                        created_at=now, expires_at=expires_at)
    return record, (_INSERT, (record.id, tenant, purpose, filename, record.bytes, now, expires_at, record.status,
                              bytes(content)))


def _record(row: tuple) -> FileRecord:
    id_, tenant, purpose, filename, size, created_at, expires_at, status = row
    return FileRecord(id=id_, tenant=tenant, purpose=purpose, filename=filename, bytes=int(size),
                      created_at=float(created_at), expires_at=None if expires_at is None else float(expires_at),
                      status=status)


class FileStore:
    """Loop thread only; every write is committed when its call returns."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, tenant: str, purpose: str, filename: str, content: bytes, *, now: float,
                     expires_at: float | None = None) -> FileRecord:
        record, (sql, params) = file_insert_statement(tenant, purpose, filename, content, now=now,
                                                      expires_at=expires_at)
        await self._db.execute(sql, params)
        return record

    async def get(self, tenant: str, file_id: str) -> FileRecord | None:
        found = await self._db.query(f"SELECT {_COLUMNS} FROM files WHERE id = ? AND tenant = ?", (file_id, tenant))
        return _record(found[0]) if found else None

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        found = await self._db.query("SELECT content FROM files WHERE id = ? AND tenant = ?", (file_id, tenant))
        return bytes(found[0][0]) if found else None

    async def delete(self, tenant: str, file_id: str) -> bool:
        """True when the tenant had the file (it is gone now)."""
        return await self._db.execute("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)) > 0

    async def list(self, tenant: str, *, purpose: str | None = None, after: str | None = None, limit: int = 10_000,
                   newest_first: bool = True) -> list[FileRecord]:
        """The tenant's files (of `purpose`), newest first (or oldest), after the file `after` (an id from
        a previous page; an id the tenant does not have gives an empty page)."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        clauses, params = ["tenant = ?"], [tenant]
        if purpose is not None:
            clauses.append("purpose = ?")
            params.append(purpose)
        if after is not None:
            op = "<" if newest_first else ">"
            clauses.append(f"seq {op} (SELECT seq FROM files WHERE id = ? AND tenant = ?)")
            params += [after, tenant]
        order = "DESC" if newest_first else "ASC"
        found = await self._db.query(f"SELECT {_COLUMNS} FROM files WHERE {' AND '.join(clauses)} "
                                     f"ORDER BY seq {order} LIMIT ?", [*params, limit])
        return [_record(row) for row in found]
