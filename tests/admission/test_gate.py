"""inferd.admission.gate through the queue: what the engine must have free before a request is released,
the prefill budget, light tenants and the headroom kept for them."""
import asyncio

from inferd.config.tenants import AdmissionConfig, TenantConfig, TenantRegistry, admission_errors
from tests.admission.harness import BS, FakeEngine, far, make_queue, req, settle, spawn  # noqa: F401


async def test_gate_needs_prompt_blocks_plus_reserve_except_for_a_light_tenant(make_queue):
    engine = FakeEngine(slots=4, blocks=100)
    q, _ = make_queue(engine=engine, kv_reserve_fraction=0.1)      # reserve = 10 blocks
    engine.free_blocks = 3
    heavy = [spawn(q.admit(req("a", prompt=4 * BS), deadline=far())) for _ in range(4)]
    await settle()
    assert not engine.submitted                 # 4 blocks each, 3 free
    engine.free_blocks = 13
    await settle()                              # found by the bounded poll (engine steps send no event)
    await asyncio.sleep(0.02)
    assert not engine.submitted                 # a has all 4 slots' worth in flight: needs 4 + 10 reserved
    engine.free_blocks = 14
    await heavy[0]
    assert len(engine.submitted) == 1 and engine.free_blocks == 10
    light = spawn(q.admit(req("b", prompt=4 * BS), deadline=far()))   # under its share (2 of 4 slots)
    assert (await light).tenant == "b"          # its 4 blocks are enough
    assert engine.free_blocks == 6 and len(engine.submitted) == 2


async def test_gate_keeps_the_engine_waiting_queue_short(make_queue):
    engine = FakeEngine(slots=10)
    q, _ = make_queue(engine=engine, max_engine_waiting=1)
    engine.waiting = 1
    waiting = spawn(q.admit(req("a"), deadline=far()))
    await settle()
    assert not engine.submitted
    engine.waiting = 0
    await waiting


async def test_kv_in_flight_cap_holds_a_tenant_without_blocking_others(make_queue):
    q, engine = make_queue(engine=FakeEngine(slots=10), tenants={"a": TenantConfig(max_kv_tokens_in_flight=30)})
    first = await q.admit(req("a", prompt=16, max_tokens=8), deadline=far())
    held = spawn(q.admit(req("a", prompt=16, max_tokens=8), deadline=far()))
    await settle()
    other = await q.admit(req("b"), deadline=far())
    assert not held.done() and other.tenant == "b"
    engine.finish(first.request_id)
    await first.collect()
    await held


async def test_headroom_lets_a_light_tenant_start_beside_a_flood(make_queue):
    engine = FakeEngine(slots=4)
    q, _ = make_queue(engine=engine, headroom_fraction=0.25,          # 1 of 4 slots, in the window only
                      headroom_without_preemption=False)
    flood = [spawn(q.admit(req("n"), deadline=far())) for _ in range(8)]
    await settle()
    assert len(engine.submitted) == 4           # nobody light around yet: the engine is filled
    engine.finish(engine.submitted[0].request_id)
    light = spawn(q.admit(req("w"), deadline=far()))   # w is not backlogged: a light arrival
    await settle()
    assert (await light).tenant == "w"
    engine.finish(engine.submitted[1].request_id)
    await asyncio.sleep(0.02)                   # polls while blocked; n may not take the headroom slot
    assert [r.tenant for r in engine.submitted].count("n") == 4 and engine.slots == 1
    del flood


async def test_heavy_tenant_waits_for_pending_prefill_to_fit_the_budget_woken_by_first_tokens(make_queue):
    engine = FakeEngine(slots=2)
    engine.slots = 10                           # a's share is 2 slots: heavy from its third request
    q, _ = make_queue(engine=engine, max_pending_prefill_tokens=100, poll_interval_s=30.0)
    first = await q.admit(req("a", prompt=60), deadline=far())
    second = await q.admit(req("a", prompt=60), deadline=far())   # still light: may exceed it up to a step
    third = spawn(q.admit(req("a", prompt=60), deadline=far()))
    await settle()
    assert len(engine.submitted) == 2
    engine.prefilled(first.request_id)
    await first.__anext__()
    await settle()
    assert not third.done()                     # 60 pending + 60 > 100
    engine.prefilled(second.request_id)
    await second.__anext__()                    # the first token wakes the dispatcher (the poll is 30 s)
    assert (await asyncio.wait_for(third, 5)).request_id == engine.submitted[2].request_id


async def test_prompt_longer_than_the_prefill_budget_goes_when_nothing_is_pending(make_queue):
    engine = FakeEngine(slots=1)
    engine.slots = 10                           # a's share is 1 slot: heavy from its second request
    q, _ = make_queue(engine=engine, max_pending_prefill_tokens=100)
    first = await q.admit(req("a", prompt=150), deadline=far())
    second = spawn(q.admit(req("a", prompt=150), deadline=far()))
    await settle()
    assert len(engine.submitted) == 1
    engine.prefilled(first.request_id)
    await first.__anext__()
    await asyncio.wait_for(second, 5)           # nothing pending: it goes although it exceeds the budget


async def test_default_prefill_budget_is_a_quarter_of_the_engine_step_budget(make_queue):
    engine = FakeEngine(slots=1)                # max_num_tokens 512: budget 128
    engine.slots = 10
    q, _ = make_queue(engine=engine)
    await q.admit(req("a", prompt=100), deadline=far())
    await q.admit(req("a", prompt=28), deadline=far())             # heavy now; 128 pending: exactly the budget
    held = spawn(q.admit(req("a", prompt=1), deadline=far()))
    await settle()
    assert len(engine.submitted) == 2 and not held.done()


async def test_light_tenant_prompt_joins_pending_prefill_up_to_a_step_ahead_of_the_flood(make_queue):
    engine = FakeEngine(slots=20)               # max_num_tokens 512
    q, _ = make_queue(engine=engine, max_pending_prefill_tokens=64)
    flood = [spawn(q.admit(req("n", prompt=64), deadline=far())) for _ in range(30)]
    await settle()
    assert len(engine.submitted) == 8           # light while under its share: up to a step pending
    light = spawn(q.admit(req("w", prompt=32), deadline=far()))
    await settle()
    assert len(engine.submitted) == 8           # 512 pending + 32 > a step
    first = await flood[0]
    engine.prefilled(first.request_id)
    await first.__anext__()
    assert (await asyncio.wait_for(light, 5)).tenant == "w"        # 448 + 32 fits a step
    await settle()
    assert [r.tenant for r in engine.submitted] == ["n"] * 8 + ["w"]   # n, heavy now, needs pending <= 64


def test_prefill_budget_must_be_positive():
    assert admission_errors(AdmissionConfig(max_pending_prefill_tokens=0)) == [
        "admission.max_pending_prefill_tokens: must be > 0 (omit it for a quarter of the engine's "
        "max_num_tokens), got 0"]
    assert admission_errors(AdmissionConfig(max_pending_prefill_tokens=512)) == []


async def test_light_tenant_does_not_wait_behind_a_heavy_pick_that_needs_a_slot(make_queue):
    engine = FakeEngine(slots=8)
    q, _ = make_queue(engine=engine, headroom_fraction=0.25,          # 2 of 8 slots, in the window only
                      headroom_without_preemption=False)
    flood = [spawn(q.admit(req("n"), deadline=far())) for _ in range(20)]
    await engine.wait_submitted(8)              # nobody light around yet: the engine is filled
    first = spawn(q.admit(req("w"), deadline=far()))
    await settle()
    engine.finish(engine.submitted[0].request_id)
    assert (await asyncio.wait_for(first, 5)).tenant == "w"
    for r in engine.submitted[1:3]:
        engine.finish(r.request_id)             # 2 free slots: the headroom, n may not take them
    q.counters["w"] = q.counters["n"] + 1000    # w was served more lately: VTC picks n first
    second = spawn(q.admit(req("w"), deadline=far()))
    assert (await asyncio.wait_for(second, 5)).tenant == "w"          # not behind n's pick
    assert [r.tenant for r in engine.submitted].count("n") == 8 and engine.slots == 1
    del flood


async def test_an_engine_that_cannot_preempt_keeps_a_standing_reserve_for_whoever_comes_next(make_queue):
    engine = FakeEngine(slots=5)                # yields_slots False, as trtllm
    q, _ = make_queue(engine=engine, headroom_fraction=0.2)           # 1 of 5 slots
    for _ in range(4):                          # one at a time: nothing queued, no light arrival's window
        await q.admit(req("beta"), deadline=far())
    fifth = spawn(q.admit(req("beta"), deadline=far()))
    await asyncio.sleep(0.02)                   # beta alone (under its share of 5) leaves the reserve free
    assert not fifth.done() and engine.slots == 1
    newcomer = await asyncio.wait_for(q.admit(req("alpha"), deadline=far()), 5)
    assert newcomer.tenant == "alpha" and engine.slots == 0


async def test_no_standing_reserve_where_only_one_tenant_can_send_read_at_each_decision(make_queue):
    engine = FakeEngine(slots=5)                # cannot preempt, as trtllm
    q, _ = make_queue(engine=engine, headroom_fraction=0.2)
    for _ in range(4):
        await q.admit(req("local"), deadline=far())
    fifth = spawn(q.admit(req("local"), deadline=far()))
    await asyncio.sleep(0.02)
    assert not fifth.done() and engine.slots == 1     # keys or certificates: someone else may come
    q.set_tenants(TenantRegistry({}, shared=False))   # a reload to auth mode "none": nobody else can
    await asyncio.wait_for(fifth, 5)
    assert engine.slots == 0

