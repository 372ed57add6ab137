"""inferd.store.batches: batches, their leases and line results, on every backend (the `db` fixture)."""
from __future__ import annotations

import asyncio

import pytest

from inferd.store import BatchError, BatchResult, BatchStore, Database, FileStore
from inferd.store.files import file_insert_statements as insert_statement
from inferd.store.owner import owner
from tests.store.test_owner import dead_process, other_namespace

DAY = 86_400.0


async def make(store: BatchStore, tenant: str = "acme", now: float = 100.0, total: int = 3, **kw):
    return await store.create(tenant, "/v1/chat/completions", "file-in", "24h", total=total,
                              metadata=kw.get("metadata"), now=now, window_s=DAY)


def result(idx: int, ok: bool = True) -> BatchResult:
    return BatchResult(idx=idx, custom_id=f"c{idx}", ok=ok, body=b'{"line": %d}' % idx)


async def test_a_new_batch_is_validating_with_openai_shape_and_only_its_tenant_sees_it(db: Database):
    store = BatchStore(db)
    made = await make(store, metadata={"k": "v"})
    assert made.id.startswith("batch_") and made.status == "validating"
    got = await store.get("acme", made.id)
    assert got == made
    body = got.to_openai()
    assert body["object"] == "batch" and body["expires_at"] == 100 + int(DAY) and body["created_at"] == 100
    assert body["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert body["metadata"] == {"k": "v"} and body["errors"] is None and body["in_progress_at"] is None
    assert await store.get("globex", made.id) is None
    assert await store.request_cancel("globex", made.id, now=101.0) is None
    assert (await store.get("acme", made.id)).status == "validating"


async def test_list_pages_newest_first(db: Database):
    store = BatchStore(db)
    made = [await make(store, now=float(i)) for i in range(5)]
    await make(store, tenant="globex")
    first = await store.list("acme", limit=3)
    assert [b.id for b in first] == [b.id for b in reversed(made)][:3]
    rest = await store.list("acme", after=first[-1].id, limit=3)
    assert [b.id for b in rest] == [made[1].id, made[0].id]


async def test_only_one_of_several_runners_acquires_a_batch_and_an_expired_lease_is_taken_over(db: Database):
    store = BatchStore(db)
    made = await make(store)
    got = await asyncio.gather(*(store.acquire(f"node{i}", 200.0, 30.0) for i in range(4)))
    winners = [g for g in got if g is not None]
    assert len(winners) == 1 and winners[0].id == made.id
    owner = winners[0].lease_owner
    assert await store.acquire("other", 220.0, 30.0) is None            # held until 230
    assert await store.renew(made.id, owner, 225.0, 30.0)               # now until 255
    assert await store.acquire("other", 240.0, 30.0) is None
    taken = await store.acquire("other", 256.0, 30.0)                   # lapsed: taken over
    assert taken is not None and taken.lease_owner == "other"
    assert not await store.renew(made.id, owner, 257.0, 30.0)           # the old owner has lost it
    await store.release(made.id, "other")
    assert (await store.acquire("third", 258.0, 30.0)).lease_owner == "third"


async def test_release_dead_frees_only_leases_of_this_nodes_dead_runners(db: Database):
    store = BatchStore(db)
    dead, elsewhere = await dead_process("n1"), await dead_process("n2")
    crashed, live, other, ended, contained = [await make(store, now=float(i)) for i in range(5)]
    holders = [dead.prefix + "runner-1", owner("n1", "runner-2"), elsewhere.prefix + "runner-3", dead.prefix + "r4",
               f"n1/{dead.pid}/{other_namespace(dead.start)}/runner-5"]     # a container's: its pid means nothing here
    for batch, holder in zip((crashed, live, other, ended, contained), holders):
        assert (await store.acquire(holder, 200.0, 30.0)).id == batch.id
    assert await store.fail(ended.id, holders[3], [BatchError(code="x", message="x")], now=201.0)
    assert await store.release_dead("n1") == 1
    assert (await store.load(crashed.id)).lease_owner is None
    assert [(await store.load(b.id)).lease_owner for b in (live, other, contained)] == [*holders[1:3], holders[4]]
    taken = await store.acquire("restarted", 201.0, 30.0)                # at once, not at 230
    assert taken is not None and taken.id == crashed.id
    assert await store.release_dead("n1") == 0


async def test_ended_batches_are_not_acquired(db: Database):
    store = BatchStore(db)
    made = await make(store)
    assert (await store.acquire("a", 1.0, 30.0)).id == made.id
    assert await store.fail(made.id, "a", [BatchError(code="invalid_batch_input", message="bad", line=2)], now=2.0)
    failed = await store.get("acme", made.id)
    assert failed.status == "failed" and failed.failed_at == 2.0 and failed.lease_owner is None
    assert failed.to_openai()["errors"] == {"object": "list", "data": [
        {"code": "invalid_batch_input", "message": "bad", "line": 2}]}
    assert await store.acquire("b", 1000.0, 30.0) is None


async def test_a_result_is_recorded_once_and_counts_follow_the_results(db: Database):
    store = BatchStore(db)
    made = await make(store)
    assert await store.record(made.id, result(0))
    assert await store.record(made.id, result(2, ok=False))
    assert not await store.record(made.id, BatchResult(idx=0, custom_id="c0", ok=False, body=b"second"))
    assert await store.recorded(made.id) == {0, 2}
    assert [(r.idx, r.ok, r.body) for r in await store.results(made.id)] == [(0, True, b'{"line": 0}'),
                                                                             (2, False, b'{"line": 2}')]
    counts = (await store.get("acme", made.id)).to_openai()["request_counts"]
    assert counts == {"total": 3, "completed": 1, "failed": 1}
    [listed] = await store.list("acme")
    assert (listed.completed, listed.failed) == (1, 1)


async def test_advance_and_cancel_race_one_wins(db: Database):
    store = BatchStore(db)
    made = await make(store)
    await store.acquire("a", 1.0, 30.0)
    assert await store.advance(made.id, "a", "validating", "in_progress", now=2.0)
    assert not await store.advance(made.id, "b", "in_progress", "finalizing", now=3.0)     # not b's lease
    cancelling = await store.request_cancel("acme", made.id, now=4.0)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at == 4.0 and cancelling.in_progress_at == 2.0
    assert not await store.advance(made.id, "a", "in_progress", "finalizing", now=5.0)     # cancelled first
    with pytest.raises(ValueError):
        await store.advance(made.id, "a", "cancelling", "completed", now=5.0)


async def test_finish_writes_files_and_end_state_together_and_drops_the_results(db: Database):
    store, files = BatchStore(db), FileStore(db)
    made = await make(store)
    await store.acquire("a", 1.0, 30.0)
    for i in range(3):
        await store.record(made.id, result(i, ok=i != 1))
    out, out_sql = insert_statement("acme", "batch_output", "out.jsonl", b"o\n", now=9.0)
    err, err_sql = insert_statement("acme", "batch_output", "err.jsonl", b"e\n", now=9.0)
    assert await store.finish(made.id, "a", "completed", files=[*out_sql, *err_sql], output_file_id=out.id,
                              error_file_id=err.id, completed=2, failed=1, now=9.0)
    done = await store.get("acme", made.id)
    assert (done.status, done.completed_at, done.output_file_id, done.error_file_id) == ("completed", 9.0, out.id,
                                                                                         err.id)
    assert done.to_openai()["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert await files.content("acme", out.id) == b"o\n"
    assert await store.results(made.id) == []
    assert await store.acquire("b", 10_000.0, 30.0) is None


async def test_finish_by_a_runner_that_lost_the_lease_writes_nothing(db: Database):
    store, files = BatchStore(db), FileStore(db)
    made = await make(store)
    await store.acquire("a", 1.0, 30.0)
    await store.record(made.id, result(0))
    await store.acquire("b", 100.0, 30.0)           # a's lease lapsed; b took the batch over
    out, out_sql = insert_statement("acme", "batch_output", "out.jsonl", b"o\n", now=101.0)
    assert not await store.finish(made.id, "a", "completed", files=[*out_sql], output_file_id=out.id,
                                  error_file_id=None, completed=1, failed=0, now=101.0)
    assert (await store.get("acme", made.id)).status == "validating"
    assert await files.get("acme", out.id) is None
    assert await db.query("SELECT idx FROM file_chunks WHERE file_id = ?", (out.id,)) == []
    assert await store.recorded(made.id) == {0}
