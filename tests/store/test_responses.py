"""Stored responses: read back by their tenant only, until they expire; deleted; purged like transcripts."""
from __future__ import annotations

from inferd.store import ResponseStore, StoredConversation


def r(i: int, tenant: str = "acme", expires_at: float = 2000.0, previous: str | None = None) -> StoredConversation:
    return StoredConversation(id=f"resp_{i}", tenant=tenant, model="small", created_at=1000.0 + i,
                              expires_at=expires_at, previous_response_id=previous,
                              response='{"id":"resp_%d","text":"a\\u0000b"}' % i,
                              conversation='[{"role":"user","content":"hi"}]')


async def test_a_response_reads_back_for_its_tenant_until_it_expires(db):
    store = ResponseStore(db)
    await store.put(r(1, expires_at=1500.0))
    await store.put(r(2, previous="resp_1"))
    assert (await store.get("acme", "resp_2", now=1100.0)) == r(2, previous="resp_1")
    assert await store.get("acme", "resp_1", now=1600.0) is None          # its period is over
    assert await store.get("other", "resp_2", now=1100.0) is None         # another tenant's is absent
    assert await store.get("acme", "resp_9", now=1100.0) is None


async def test_delete_removes_only_the_tenants_own_response(db):
    store = ResponseStore(db)
    await store.put(r(1))
    assert not await store.delete("other", "resp_1")
    assert await store.delete("acme", "resp_1")
    assert not await store.delete("acme", "resp_1")
    assert await store.get("acme", "resp_1", now=1100.0) is None


async def test_purge_deletes_expired_responses_and_those_past_a_tenants_period_now(db):
    store = ResponseStore(db)
    await store.put(r(1, expires_at=1050.0))
    await store.put(r(2, tenant="now-none", expires_at=10_000.0))
    await store.put(r(3, tenant="kept", expires_at=10_000.0))
    periods = {"acme": 50.0, "now-none": 0.0, "kept": 5000.0}
    assert await store.purge(now=1100.0, retention_of=periods.__getitem__) == 2
    assert await store.purge(now=1100.0) == 0
    assert (await store.get("kept", "resp_3", now=1100.0)).tenant == "kept"
