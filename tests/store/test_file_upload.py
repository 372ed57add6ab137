"""inferd.store.file_upload: a file written chunk by chunk, visible only once finished, on every backend."""
from __future__ import annotations

import pytest

from inferd.store import Database, FileStore
from inferd.store.file_upload import Upload
from inferd.store.files import CHUNK_BYTES


async def _chunk_rows(db: Database, file_id: str) -> list[tuple]:
    return await db.query("SELECT idx FROM file_chunks WHERE file_id = ? ORDER BY idx", (file_id,))


async def test_a_file_written_in_chunks_is_invisible_until_finished_then_reads_back_whole(db: Database):
    files, upload = FileStore(db), Upload(db, "acme")
    pieces = [b"a" * CHUNK_BYTES, b"b" * CHUNK_BYTES, b"tail\n"]
    for piece in pieces:
        await upload.write(piece, now=10.0)
    assert await files.get("acme", upload.file_id) is None and await files.list("acme") == []
    assert await files.chunks("acme", upload.file_id) is None
    record = await upload.finish("batch", "in.jsonl", now=11.0)
    assert record.bytes == sum(map(len, pieces)) and await files.get("acme", record.id) == record
    assert await files.content("acme", record.id) == b"".join(pieces)
    assert [chunk async for chunk in await files.chunks("acme", record.id)] == pieces
    assert await files.usage("acme") == (record.bytes, 1) and await files.usage("globex") == (0, 0)
    assert await files.delete("acme", record.id) and await _chunk_rows(db, record.id) == []


async def test_an_aborted_upload_leaves_no_chunks_and_a_chunk_over_the_bound_is_refused(db: Database):
    upload = Upload(db, "acme")
    await upload.write(b"x" * 10, now=1.0)
    with pytest.raises(ValueError, match="at most"):
        await upload.write(b"x" * (CHUNK_BYTES + 1), now=1.0)
    await upload.abort()
    assert await _chunk_rows(db, upload.file_id) == []


async def test_purge_orphans_deletes_old_chunks_of_no_file_only(db: Database):
    files = FileStore(db)
    dead, live, done = Upload(db, "acme"), Upload(db, "acme"), Upload(db, "acme")
    await dead.write(b"old", now=100.0)
    await live.write(b"new", now=10_000.0)
    await done.write(b"kept", now=100.0)
    await done.finish("batch", "f.jsonl", now=100.0)
    assert await files.purge_orphans(now=10_001.0, age_s=3600.0) == 1
    assert await _chunk_rows(db, dead.file_id) == []
    assert await _chunk_rows(db, live.file_id) == [(0,)] and await files.content("acme", done.file_id) == b"kept"
