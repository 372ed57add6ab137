"""inferd.admission.slots through the queue: who is asked to yield a slot (the over-share tenant's newest,
never one at or under its share), for whom (a tenant owed one whose request would then start), and how
often (at most once per engine step; a yielded slot is not taken back by the tenant that gave it)."""
import asyncio

from inferd.config.tenants import TenantConfig
from tests.admission.harness import BS, FakeEngine, far, make_queue, req, settle, spawn  # noqa: F401


async def fill(q, tenant, n):
    return [await q.admit(req(tenant), deadline=far()) for _ in range(n)]


async def test_a_tenant_with_nothing_running_gets_a_slot_from_the_over_share_tenants_newest(make_queue):
    q, engine = make_queue(engine=FakeEngine(slots=4, yields=True))
    beta = await fill(q, "beta", 4)                      # alone: its share is every slot
    alpha = await asyncio.wait_for(q.admit(req("alpha"), deadline=far()), 5)
    assert alpha.tenant == "alpha"
    assert engine.yielded == [beta[-1].request_id]     # the newest; its stream only pauses
    assert not beta[-1].finished


async def test_never_a_tenant_at_or_below_its_weighted_share(make_queue):
    tenants = {"beta": TenantConfig(weight=3), "gamma": TenantConfig(weight=1)}
    q, engine = make_queue(engine=FakeEngine(slots=4, yields=True), tenants=tenants)
    beta = await fill(q, "beta", 3)
    await fill(q, "gamma", 1)
    # With alpha: shares 2.4, 0.8, 0.8. Beta would drop under its share by yielding one; gamma too.
    waiting = spawn(q.admit(req("alpha"), deadline=far()))
    await settle()
    engine.steps += 1
    await engine.dispatcher_passes()             # the dispatcher polls while blocked
    assert not waiting.done() and engine.yielded == []
    engine.finish(beta[0].request_id)
    assert (await asyncio.wait_for(waiting, 5)).tenant == "alpha"


async def test_at_most_one_fairness_preemption_per_engine_step(make_queue):
    q, engine = make_queue(engine=FakeEngine(slots=4, yields=True))
    beta = await fill(q, "beta", 4)
    first = spawn(q.admit(req("alpha"), deadline=far()))
    second = spawn(q.admit(req("alpha"), deadline=far()))
    await asyncio.wait_for(first, 5)
    await engine.dispatcher_passes()
    assert not second.done() and engine.yielded == [beta[3].request_id]
    engine.steps += 1                                     # the next step: alpha, under its share (2), gets another
    await asyncio.wait_for(second, 5)
    assert engine.yielded == [beta[3].request_id, beta[2].request_id]
    third = spawn(q.admit(req("alpha"), deadline=far()))
    engine.steps += 1
    await engine.dispatcher_passes()             # alpha holds its share, beta only its share: none
    assert not third.done() and len(engine.yielded) == 2


async def test_none_when_the_waiting_request_could_not_start_anyway(make_queue):
    q, engine = make_queue(engine=FakeEngine(slots=4, blocks=8, yields=True))
    await fill(q, "beta", 4)                              # 4 of the 8 KV blocks
    waiting = spawn(q.admit(req("alpha", prompt=80), deadline=far()))   # needs 5 blocks: a slot would not do
    await settle()
    engine.steps += 1
    await engine.dispatcher_passes()
    assert not waiting.done() and engine.yielded == []


async def test_the_tenant_that_yielded_does_not_take_its_slot_back(make_queue):
    q, engine = make_queue(engine=FakeEngine(slots=2, yields=True))
    beta = await fill(q, "beta", 2)
    more = spawn(q.admit(req("beta"), deadline=far()))   # queued behind its own two
    alpha = await asyncio.wait_for(q.admit(req("alpha"), deadline=far()), 5)
    assert engine.yielded == [beta[1].request_id]
    engine.finish(alpha.request_id)                       # a slot frees: it is the parked one's
    await alpha.collect()
    await engine.dispatcher_passes()
    assert not more.done()
    engine.resume(beta[1].request_id)                     # back in its slot, delivering again
    await beta[1].__anext__()
    engine.finish(beta[0].request_id)
    assert (await asyncio.wait_for(more, 5)).tenant == "beta"


async def test_a_yielded_sequence_still_holds_no_slot_after_the_step_in_flight_delivers_for_it(make_queue):
    # The fake engine's step in flight delivers one more token for the yielded sequence. Read, it must
    # not count as resumed (only the engine says so), or beta would look over its share and give a
    # slot up again: gamma, arriving later, would take beta's last slot.
    tenants = {"alpha": TenantConfig(), "beta": TenantConfig(), "gamma": TenantConfig()}
    q, engine = make_queue(engine=FakeEngine(slots=2, yields=True), tenants=tenants)
    beta = await fill(q, "beta", 2)
    await asyncio.wait_for(q.admit(req("alpha"), deadline=far()), 5)
    assert engine.yielded == [beta[1].request_id]
    assert (await asyncio.wait_for(beta[1].__anext__(), 5)).token_ids == [7]   # the in-flight token
    gamma = spawn(q.admit(req("gamma"), deadline=far()))
    engine.steps += 1
    await engine.dispatcher_passes()
    assert not gamma.done() and engine.yielded == [beta[1].request_id]
    engine.resume(beta[1].request_id)
    engine.finish(beta[1].request_id)     # beta holds one again, then ends: its slot is gamma's
    assert (await asyncio.wait_for(gamma, 5)).tenant == "gamma"


async def test_off_by_config_and_on_an_engine_that_cannot_preempt(make_queue):
    for engine, policy in ((FakeEngine(slots=2, yields=True), {"fairness_preemption": False}),
                           (FakeEngine(slots=2), {"headroom_without_preemption": False})):
        q, _ = make_queue(engine=engine, **policy)
        await fill(q, "beta", 2)
        waiting = spawn(q.admit(req("alpha"), deadline=far()))
        await engine.dispatcher_passes()
        assert not waiting.done() and engine.yielded == []


async def test_a_tenant_short_of_kv_blocks_gets_a_sequence_yielded_by_the_tenant_over_its_kv_share(make_queue):
    # Slots are not short (beta holds 3 of 8); KV blocks are: beta holds 15 of 20. The fake engine frees
    # the yielded sequence's blocks only later (as the reference engine, at its next step).
    q, engine = make_queue(engine=FakeEngine(slots=8, blocks=20, yields=True))
    beta = [await q.admit(req("beta", prompt=5 * BS), deadline=far()) for _ in range(3)]
    alpha = await asyncio.wait_for(q.admit(req("alpha", prompt=6 * BS), deadline=far()), 5)
    assert alpha.tenant == "alpha" and engine.yielded == [beta[-1].request_id]
    second = spawn(q.admit(req("alpha", prompt=BS), deadline=far()))
    await engine.dispatcher_passes()     # beta now holds 10 of its 10: it yields no more (not this step either)
    engine.steps += 1
    await engine.dispatcher_passes()
    assert not second.done() and engine.yielded == [beta[-1].request_id]


async def test_no_kv_yield_from_a_tenant_at_its_kv_share_or_when_the_request_could_not_start(make_queue):
    q, engine = make_queue(engine=FakeEngine(slots=8, blocks=12, yields=True))
    for _ in range(2):
        await q.admit(req("beta", prompt=5 * BS), deadline=far())   # 10 of 12: yielding one leaves 5 < 6
    waiting = spawn(q.admit(req("alpha", prompt=3 * BS), deadline=far()))
    await engine.dispatcher_passes()
    assert not waiting.done() and engine.yielded == []
    q2, engine2 = make_queue(engine=FakeEngine(slots=8, blocks=20, yields=True))
    for _ in range(3):
        await q2.admit(req("beta", prompt=5 * BS), deadline=far())
    engine2.waiting = 2                 # the engine's own queue is full: the blocks would not start it
    waiting2 = spawn(q2.admit(req("alpha", prompt=6 * BS), deadline=far()))
    await engine2.dispatcher_passes()
    assert not waiting2.done() and engine2.yielded == []
