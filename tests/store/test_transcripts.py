"""Transcripts: kept until their retention ends, then purged; read back per tenant, newest first."""
from __future__ import annotations

from inferd.store import Transcript, Transcripts


def t(i: int, tenant: str = "acme", expires_at: float = 2000.0) -> Transcript:
    return Transcript(request_id=f"r{i}", tenant=tenant, model="small", created_at=1000.0 + i, expires_at=expires_at,
                      prompt=f"prompt {i}", completion=f"completion {i}")


async def test_a_transcript_reads_back_until_it_expires_and_purge_deletes_it(db):
    store = Transcripts(db)
    await store.record(t(1, expires_at=1500.0))
    await store.record(t(2))
    await store.record(t(3, tenant="other"))
    assert [x.request_id for x in await store.for_tenant("acme", now=1100.0)] == ["r2", "r1"]
    assert [x.request_id for x in await store.for_tenant("acme", now=1600.0)] == ["r2"]   # r1's period is over
    assert await store.purge(now=1600.0) == 1
    assert await store.purge(now=1600.0) == 0
    assert (await store.for_tenant("acme", now=1100.0))[0].completion == "completion 2"
