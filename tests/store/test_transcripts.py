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


async def test_a_tenants_current_retention_purges_what_its_old_period_would_have_kept(db):
    store = Transcripts(db)
    await store.record(t(1, expires_at=10_000.0))                     # written under a long period
    await store.record(t(2, tenant="now-none", expires_at=10_000.0))
    await store.record(t(3, tenant="kept", expires_at=10_000.0))
    periods = {"acme": 50.0, "now-none": 0.0, "kept": 5000.0}
    assert await store.purge(now=1100.0, retention_of=periods.__getitem__) == 2
    assert [x.tenant for x in await store.for_tenant("kept", now=1100.0)] == ["kept"]


async def test_text_with_a_nul_is_stored_without_it(db):
    store = Transcripts(db)
    await store.record(Transcript(request_id="r", tenant="a", model="m", created_at=1.0, expires_at=9.0,
                                  prompt="a\x00b", completion="c"))
    assert (await store.for_tenant("a", now=2.0))[0].prompt == "a\ufffdb"
