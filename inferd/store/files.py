"""Files of the Batch API, per tenant: uploaded inputs (purpose "batch") and the output and error files
batches write (purpose "batch_output"). The content lives in `file_chunks`, CHUNK_BYTES a row, written as an upload
arrives (inferd.store.file_upload); the `files` row comes last, so a file is whole or absent. A file
written before chunks existed keeps its content in its row; readers take either.

A tenant sees only its own files: another tenant's id is "not found" (None), exactly as an unknown one,
so ids cannot be probed across tenants.
"""
from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import msgspec

from inferd.store.db import Database, StoreUnavailable
from inferd.store.disk_reserve import ensure_reserve, release_reserve

FILE_PREFIX = "file-"
CHUNK_BYTES = 1024 * 1024           # the most one chunk row holds (and an upload holds in memory)
ORPHAN_AGE_S = 6 * 3600.0           # chunks without a file row this old are a dead upload's
_COLUMNS = "id, tenant, purpose, filename, bytes, created_at, expires_at, status"
_INSERT = ("INSERT INTO files (id, tenant, purpose, filename, bytes, created_at, expires_at, status, content) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
CHUNK_INSERT = "INSERT INTO file_chunks (file_id, idx, data, created_at) VALUES (?, ?, ?, ?)"


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


def file_row_statement(record: FileRecord) -> tuple[str, tuple]:
    """The INSERT of `record`'s row (its content already in file_chunks)."""
    return _INSERT, (record.id, record.tenant, record.purpose, record.filename, record.bytes, record.created_at,
                     record.expires_at, record.status, b"")


def file_insert_statements(tenant: str, purpose: str, filename: str, content: bytes, *, now: float,
                           expires_at: float | None = None) -> tuple[FileRecord, list[tuple[str, tuple]]]:
    """The record and the INSERTs creating it (its chunks, then its row), for a caller that writes them in
    a transaction of its own (a batch's output files are written with the batch's end, inferd.store.batches)."""
    record = FileRecord(id=new_file_id(), tenant=tenant, purpose=purpose, filename=filename, bytes=len(content),
                        created_at=now, expires_at=expires_at)
    view = memoryview(content)
    chunks = [(CHUNK_INSERT, (record.id, i, bytes(view[at:at + CHUNK_BYTES]), now))
              for i, at in enumerate(range(0, len(content), CHUNK_BYTES))]
    return record, [*chunks, file_row_statement(record)]


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
        record, statements = file_insert_statements(tenant, purpose, filename, content, now=now,
                                                    expires_at=expires_at)
        await self._db.transaction(statements)
        return record

    async def get(self, tenant: str, file_id: str) -> FileRecord | None:
        found = await self._db.query(f"SELECT {_COLUMNS} FROM files WHERE id = ? AND tenant = ?", (file_id, tenant))
        return _record(found[0]) if found else None

    async def chunks(self, tenant: str, file_id: str) -> AsyncIterator[bytes] | None:
        """The file's content, a chunk at a time (None: the tenant has no such file)."""
        if await self.get(tenant, file_id) is None:
            return None
        return self._chunks(tenant, file_id)

    async def _chunks(self, tenant: str, file_id: str) -> AsyncIterator[bytes]:
        idx = 0
        while found := await self._db.query("SELECT data FROM file_chunks WHERE file_id = ? AND idx = ?",
                                            (file_id, idx)):
            yield bytes(found[0][0])
            idx += 1
        if idx == 0:        # written before chunks: the content is in the row
            found = await self._db.query("SELECT content FROM files WHERE id = ? AND tenant = ?", (file_id, tenant))
            if found and found[0][0]:
                yield bytes(found[0][0])

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        """The whole content (for a caller that needs it all; a download streams `chunks`)."""
        parts = await self.chunks(tenant, file_id)
        return None if parts is None else b"".join([chunk async for chunk in parts])

    async def delete(self, tenant: str, file_id: str) -> bool:
        """True when the tenant had the file (it is gone now). On a full disk the store's reserve
        (inferd.store.disk_reserve) is freed for the delete to commit: deleting is how space comes back."""
        statements = [("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)),
                      ("DELETE FROM file_chunks WHERE file_id = ? AND NOT EXISTS "
                       "(SELECT 1 FROM files WHERE id = ?)", (file_id, file_id))]
        try:
            counts = await self._db.transaction(statements)
        except StoreUnavailable:
            if not await release_reserve(self._db):
                raise
            counts = await self._db.transaction(statements)
        await ensure_reserve(self._db)
        return counts[0] > 0

    async def usage(self, tenant: str) -> tuple[int, int]:
        """(bytes, files) the tenant stores: uploads and batch outputs."""
        [(size, count)] = await self._db.query("SELECT COALESCE(SUM(bytes), 0), COUNT(*) FROM files WHERE tenant = ?",
                                               (tenant,))
        return int(size), int(count)

    async def purge_orphans(self, now: float, age_s: float = ORPHAN_AGE_S) -> int:
        """Delete chunks of uploads that never finished (their process died) and are older than `age_s`."""
        return await self._db.execute("DELETE FROM file_chunks WHERE created_at < ? AND NOT EXISTS "
                                      "(SELECT 1 FROM files WHERE files.id = file_chunks.file_id)", (now - age_s,))

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
