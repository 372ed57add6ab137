"""One file being written as it arrives: its chunks committed one by one, its `files` row last.

Memory is one chunk (inferd.store.files.CHUNK_BYTES) whatever the file's size, and each chunk is its own
write, so the store's writer interleaves an upload's chunks with everyone else's writes (the ledger's)
instead of taking one long transaction. Until `finish` the chunks belong to no file: nothing lists or
reads them, and `abort` (or, after a crash, FileStore.purge_orphans) deletes them.
"""
from __future__ import annotations

import asyncio

from inferd.store.db import Database, StoreError
from inferd.store.disk_reserve import ensure_reserve
from inferd.store.files import CHUNK_BYTES, CHUNK_INSERT, FileRecord, file_row_statement, new_file_id


class Upload:
    """Loop thread only. write() chunks in order, then finish() once, or abort()."""

    def __init__(self, db: Database, tenant: str) -> None:
        self._db = db
        self.tenant = tenant
        self.file_id = new_file_id()
        self.size = 0
        self._next = 0
        self._tried = False         # a chunk was sent to the store (it may commit even if its caller is cancelled)
        self._done = False

    async def write(self, chunk: bytes, *, now: float) -> None:
        """Commit the next chunk (at most CHUNK_BYTES)."""
        if len(chunk) > CHUNK_BYTES:
            raise ValueError(f"a chunk holds at most {CHUNK_BYTES} bytes, got {len(chunk)}")
        if self._done:
            raise RuntimeError("this upload is finished")
        self._tried = True
        await self._db.execute(CHUNK_INSERT, (self.file_id, self._next, chunk, now))
        self._next += 1
        self.size += len(chunk)

    async def finish(self, purpose: str, filename: str, *, now: float,
                     expires_at: float | None = None) -> FileRecord:
        """Make the file visible: its row, committed (the chunks already are)."""
        record = FileRecord(id=self.file_id, tenant=self.tenant, purpose=purpose, filename=filename,
                            bytes=self.size, created_at=now, expires_at=expires_at)
        sql, params = file_row_statement(record)
        await self._db.execute(sql, params)
        self._done = True
        await ensure_reserve(self._db)          # a moment with room: make the reserve if a delete used it
        return record

    async def abort(self) -> None:
        """Delete what was written (a failed or refused upload leaves nothing behind). Runs to its end
        even when the caller is cancelled (a client that left)."""
        if self._done or not self._tried:
            return
        self._done = True
        task = asyncio.ensure_future(self._db.execute("DELETE FROM file_chunks WHERE file_id = ?", (self.file_id,)))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await _quietly(task)
            raise
        except StoreError:
            pass        # left to FileStore.purge_orphans: the chunks belong to no file, nothing reads them


async def _quietly(task: asyncio.Future) -> None:
    try:
        await task
    except StoreError:
        pass
