"""inferd.store.files: the Batch API's files, per tenant, on every backend (the `db` fixture)."""
from __future__ import annotations

import pytest

from inferd.store import Database, FileStore
from inferd.store.files import file_insert_statements as insert_statement


async def test_a_created_file_reads_back_with_its_content_and_openai_shape(db: Database):
    files = FileStore(db)
    content = b'{"a": 1}\n\x00\xffbinary too\n'
    made = await files.create("acme", "batch", "in.jsonl", content, now=1000.5)
    assert made.id.startswith("file-") and made.bytes == len(content)
    assert await files.get("acme", made.id) == made
    assert await files.content("acme", made.id) == content
    assert made.to_openai() == {"id": made.id, "object": "file", "bytes": len(content), "created_at": 1000,
                                "filename": "in.jsonl", "purpose": "batch", "status": "processed",
                                "expires_at": None, "status_details": None}


async def test_another_tenants_file_is_not_found_for_reading_or_deleting(db: Database):
    files = FileStore(db)
    made = await files.create("acme", "batch", "in.jsonl", b"x", now=1.0)
    assert await files.get("globex", made.id) is None
    assert await files.content("globex", made.id) is None
    assert await files.delete("globex", made.id) is False
    assert await files.list("globex") == []
    assert await files.get("acme", made.id) is not None


async def test_delete_removes_the_file_once(db: Database):
    files = FileStore(db)
    made = await files.create("acme", "batch", "in.jsonl", b"x", now=1.0)
    assert await files.delete("acme", made.id) is True
    assert await files.get("acme", made.id) is None
    assert await files.content("acme", made.id) is None
    assert await files.delete("acme", made.id) is False


async def test_list_is_newest_first_filtered_by_purpose_and_pages_after_an_id(db: Database):
    files = FileStore(db)
    made = [await files.create("acme", "batch" if i % 2 == 0 else "batch_output", f"f{i}", b"x", now=float(i))
            for i in range(5)]
    await files.create("globex", "batch", "theirs", b"x", now=9.0)
    assert [f.id for f in await files.list("acme")] == [f.id for f in reversed(made)]
    assert [f.id for f in await files.list("acme", newest_first=False)] == [f.id for f in made]
    assert [f.filename for f in await files.list("acme", purpose="batch")] == ["f4", "f2", "f0"]
    first = await files.list("acme", limit=2)
    rest = await files.list("acme", after=first[-1].id, limit=10)
    assert [f.id for f in first + rest] == [f.id for f in reversed(made)]
    assert await files.list("acme", after="file-unknown") == []
    with pytest.raises(ValueError, match="limit"):
        await files.list("acme", limit=0)


async def test_insert_statement_writes_the_record_it_returns_in_a_callers_transaction(db: Database):
    record, statements = insert_statement("acme", "batch_output", "out.jsonl", b"line\n", now=5.0)
    await db.transaction(statements)
    assert await FileStore(db).get("acme", record.id) == record
    assert await FileStore(db).content("acme", record.id) == b"line\n"
