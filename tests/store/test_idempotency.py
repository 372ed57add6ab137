"""IdempotencyStore: claim outcomes, holds and their takeover, expiry, release, finish by the owner only."""
from __future__ import annotations

import asyncio
import hashlib

import pytest

from inferd.store import Claim, IdempotencyStore, StoredResponse
from inferd.store.owner import owner
from tests.store.test_owner import dead_process, other_namespace

BODY = hashlib.sha256(b'{"prompt": "hi"}').digest()
OTHER = hashlib.sha256(b'{"prompt": "bye"}').digest()
T0 = 1_800_000_000.0
HOLD, TTL = 60.0, 3600.0
RESPONSE = StoredResponse(status=200, headers={"Content-Type": "text/event-stream", "X-Inferd-Node": "n1"},
                          body=b"data: {}\n\ndata: [DONE]\n\n", stream=True)


@pytest.fixture
def store(db) -> IdempotencyStore:
    return IdempotencyStore(db)


async def claim(store: IdempotencyStore, owner: str, now: float = T0, body: bytes = BODY, key: str = "k1",
                tenant: str = "acme") -> Claim:
    return await store.claim(tenant, key, body, owner, now=now, hold_s=HOLD, ttl_s=TTL)


async def test_first_claim_is_new_then_in_flight_then_done(store):
    assert await claim(store, "req-1") == Claim(outcome="new")
    assert await claim(store, "req-2", now=T0 + 1) == Claim(outcome="in_flight", held_until=T0 + HOLD)
    await store.finish("acme", "k1", "req-1", RESPONSE, now=T0 + 2, ttl_s=TTL)
    assert await claim(store, "req-3", now=T0 + 3) == Claim(outcome="done", response=RESPONSE)


async def test_another_body_is_a_mismatch_running_or_done(store):
    await claim(store, "req-1")
    assert (await claim(store, "req-2", body=OTHER)).outcome == "mismatch"
    await store.finish("acme", "k1", "req-1", RESPONSE, now=T0, ttl_s=TTL)
    assert (await claim(store, "req-3", body=OTHER)).outcome == "mismatch"


async def test_keys_are_per_tenant(store):
    assert (await claim(store, "req-1")).outcome == "new"
    assert (await claim(store, "req-2", tenant="beta")).outcome == "new"
    assert (await claim(store, "req-3", key="k2")).outcome == "new"


async def test_of_concurrent_claims_exactly_one_wins(store):
    claims = await asyncio.gather(*(claim(store, f"req-{i}") for i in range(20)))
    assert sorted(c.outcome for c in claims) == ["in_flight"] * 19 + ["new"]


async def test_an_unfinished_claim_past_its_hold_is_taken_over(store):
    await claim(store, "crashed")
    assert (await claim(store, "retry", now=T0 + HOLD - 1)).outcome == "in_flight"
    assert (await claim(store, "retry", now=T0 + HOLD)).outcome == "new"
    # the first holder's late finish no longer counts: the key is the new owner's
    await store.finish("acme", "k1", "crashed", RESPONSE, now=T0 + HOLD + 1, ttl_s=TTL)
    assert (await claim(store, "third", now=T0 + HOLD + 2)).outcome == "in_flight"
    # nor does a takeover change the body a later claim must match
    assert (await claim(store, "fourth", now=T0 + HOLD + 2, body=OTHER)).outcome == "mismatch"


async def test_a_finished_record_is_replayed_until_its_ttl_then_replaced(store):
    await claim(store, "req-1")
    await store.finish("acme", "k1", "req-1", RESPONSE, now=T0 + 10, ttl_s=TTL)
    assert (await claim(store, "req-2", now=T0 + 10 + TTL - 1)).outcome == "done"
    assert (await claim(store, "req-3", now=T0 + 10 + TTL, body=OTHER)).outcome == "new"


async def test_release_forgets_the_claim_so_a_retry_runs(store):
    await claim(store, "req-1")
    await store.release("acme", "k1", "someone-else")        # not the owner: nothing happens
    assert (await claim(store, "req-2")).outcome == "in_flight"
    await store.release("acme", "k1", "req-1")
    assert (await claim(store, "req-2")).outcome == "new"


async def test_finish_by_a_non_owner_does_nothing(store):
    await claim(store, "req-1")
    await store.finish("acme", "k1", "intruder", RESPONSE, now=T0, ttl_s=TTL)
    assert (await claim(store, "req-2")).outcome == "in_flight"


async def test_purge_expired_deletes_only_expired_records(store):
    await claim(store, "a", key="running")                                  # expires at T0 + TTL
    await claim(store, "b", key="done")
    await store.finish("acme", "done", "b", RESPONSE, now=T0 + 100, ttl_s=TTL)      # expires at T0 + 100 + TTL
    assert await store.purge_expired(T0 + TTL - 1) == 0
    assert await store.purge_expired(T0 + TTL) == 1
    assert (await claim(store, "c", key="done", now=T0 + TTL)).outcome == "done"
    assert await store.purge_expired(T0 + 100 + TTL) == 1
    assert (await claim(store, "d", key="done", now=T0 + 100 + TTL)).outcome == "new"


async def test_hold_and_ttl_must_be_positive(store):
    with pytest.raises(ValueError, match="hold_s"):
        await store.claim("acme", "k1", BODY, "req-1", now=T0, hold_s=0, ttl_s=TTL)


async def test_release_dead_deletes_only_unfinished_claims_of_this_nodes_dead_processes(store):
    dead, elsewhere = await dead_process("n1"), await dead_process("n2")
    await claim(store, dead.prefix + "r1", key="crashed")
    await claim(store, dead.prefix + "r2", key="crashed-done")
    await store.finish("acme", "crashed-done", dead.prefix + "r2", RESPONSE, now=T0, ttl_s=TTL)
    await claim(store, owner("n1", "r3"), key="mine-running")               # this process: alive
    await claim(store, elsewhere.prefix + "r4", key="other-node")          # another node's: may be alive
    await claim(store, "req-5", key="old-form")                            # no process named: left to lapse
    await claim(store, f"n1/{dead.pid}/{other_namespace(dead.start)}/r6", key="other-pid-namespace")
    await claim(store, f"n1/{dead.pid}/b0a1.{dead.start.rpartition('.')[2]}/r7", key="no-namespace")
    assert await store.release_dead("n1") == 1
    assert (await claim(store, "retry", key="crashed", now=T0 + 1)).outcome == "new"
    assert (await claim(store, "retry", key="crashed-done", now=T0 + 1)).outcome == "done"
    for key in ("mine-running", "other-node", "old-form", "other-pid-namespace", "no-namespace"):
        assert (await claim(store, "retry", key=key, now=T0 + 1)).outcome == "in_flight"
    assert await store.release_dead("n1") == 0
