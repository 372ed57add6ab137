"""inferd.admission.fair_queue: the queue and its dispatcher: release order, bounds, shedding, deadlines and TTLs."""
import asyncio

import pytest

from inferd.admission.fair_queue import UNKNOWN_WAIT_S, AdmissionRejected, QueueLoad
from inferd.admission.ticket import QUEUED
from inferd.config.tenants import PriorityClass, TenantConfig, TenantRegistry
from inferd.tenancy.quota import Quota
from inferd.types import FinishReason
from tests.admission.harness import FakeEngine, drain_order, far, make_queue, occupy, req, settle, spawn  # noqa: F401


async def test_released_at_once_when_engine_has_room(make_queue):
    q, engine = make_queue()
    stream = await q.admit(req("a"), deadline=far())
    assert engine.submitted[0].request_id == stream.request_id
    engine.finish(stream.request_id, n_out=4)
    out = await stream.collect()
    assert out.finish_reason is FinishReason.STOP and len(out.token_ids) == 4


async def test_capacity_gate_holds_work_until_a_slot_frees(make_queue):
    q, engine = make_queue(engine=FakeEngine(slots=1))
    first = await q.admit(req("a"), deadline=far())
    second = spawn(q.admit(req("a"), deadline=far()))
    await settle()
    assert len(engine.submitted) == 1 and not second.done()
    engine.finish(first.request_id)
    await first.collect()                       # the finishing stream wakes the dispatcher
    assert (await second).request_id == engine.submitted[1].request_id


async def test_close_returns_even_when_the_dispatchers_cancel_is_swallowed(make_queue, monkeypatch):
    # asyncio.wait_for (3.10/3.11) can swallow a cancel that races its timeout; close() must still return.
    real_wait_for = asyncio.wait_for

    async def swallowing_wait_for(aw, timeout):
        try:
            return await real_wait_for(aw, timeout)
        except asyncio.CancelledError:
            return None

    q, engine = make_queue(engine=FakeEngine(slots=1))
    await q.admit(req("a"), deadline=far())
    monkeypatch.setattr(asyncio, "wait_for", swallowing_wait_for)
    blocked = spawn(q.admit(req("a"), deadline=far()))     # waits on capacity: the dispatcher polls
    await settle()
    closing = spawn(q.close())
    done, _ = await asyncio.wait({closing}, timeout=5)
    assert closing in done, "close() hung on a dispatcher whose cancel was swallowed"
    with pytest.raises(AdmissionRejected):
        await blocked


async def test_dispatcher_sleeps_when_idle(make_queue):
    q, engine = make_queue()
    await settle()
    calls = engine.capacity_calls
    await asyncio.sleep(0.05)                   # an idle queue must not poll the engine
    assert engine.capacity_calls == calls


async def test_vtc_serves_backlogged_tenants_in_proportion_to_weight(make_queue):
    tenants = {"a": TenantConfig(weight=3), "b": TenantConfig(weight=1)}
    q, engine = make_queue(tenants=tenants)
    await occupy(q, engine)
    tickets = [spawn(q.admit(req(t), deadline=far())) for t in "ab" * 20]
    await settle()
    order = await drain_order(q, engine, tickets, 24)
    assert order.count("a") == 18 and order.count("b") == 6
    for t in tickets:
        t.cancel()


async def test_the_engine_gets_each_request_with_its_tenants_weight_as_configured_now(make_queue):
    q, engine = make_queue(engine=FakeEngine(slots=4), tenants={"a": TenantConfig(weight=3)})
    await q.admit(req("a"), deadline=far())
    await q.admit(req("b"), deadline=far())
    q.set_tenants(TenantRegistry({"a": TenantConfig(weight=0.5)}))
    await q.admit(req("a"), deadline=far())
    assert [r.weight for r in engine.submitted] == [3, 1, 0.5]


async def test_fcfs_policy_releases_in_arrival_order(make_queue):
    q, engine = make_queue(tenants={"a": TenantConfig(weight=3)}, scheduling="fcfs")
    await occupy(q, engine)
    tickets = [spawn(q.admit(req(t), deadline=far())) for t in "aabab"]
    await settle()
    assert await drain_order(q, engine, tickets, 5) == list("aabab")


async def test_returning_tenant_is_lifted_and_banks_no_credit(make_queue):
    q, engine = make_queue()
    await occupy(q, engine)
    a_tickets = [spawn(q.admit(req("a"), deadline=far())) for _ in range(12)]
    await settle()
    await drain_order(q, engine, a_tickets, 10)           # only a is backlogged: b is idle meanwhile
    b_tickets = [spawn(q.admit(req("b"), deadline=far())) for _ in range(4)]
    await settle()
    assert q.counters["b"] == pytest.approx(q.counters["a"])
    a_tickets += [spawn(q.admit(req("a"), deadline=far())) for _ in range(4)]
    await settle()
    order = await drain_order(q, engine, a_tickets + b_tickets, 6)
    assert order.count("b") == 3                          # alternates instead of b taking 6 in a row


async def test_interactive_goes_first_but_lower_classes_keep_their_reserved_share(make_queue):
    tenants = {"i": TenantConfig(priority=PriorityClass.INTERACTIVE),
               "s": TenantConfig(priority=PriorityClass.STANDARD)}
    q, engine = make_queue(tenants=tenants, standard_reserved_share=0.25, batch_reserved_share=0.0)
    await occupy(q, engine)
    s = [spawn(q.admit(req("s"), deadline=far())) for _ in range(10)]
    i = [spawn(q.admit(req("i"), deadline=far())) for _ in range(30)]
    await settle()
    order = await drain_order(q, engine, s + i, 20)
    assert order[0] == "i"
    assert 4 <= order.count("s") <= 6                      # ~25% of served cost
    for t in s + i:
        t.cancel()


async def test_cancelled_caller_leaves_the_queue_and_returns_its_lease(make_queue):
    q, engine = make_queue()
    quota = Quota(TenantRegistry({"a": TenantConfig(max_concurrent_requests=5)}))
    await occupy(q, engine)
    lease = quota.acquire("a", prompt_tokens=16, max_tokens=8)
    waiting = spawn(q.admit(req("a"), deadline=far(), lease=lease))
    await settle()
    assert q.snapshot()["queued"] == 1
    waiting.cancel()
    await settle()
    assert q.snapshot()["queued"] == 0 and quota.snapshot()["a"]["in_flight"] == 0


async def test_tenant_queue_bound_is_429_queue_full(make_queue):
    q, engine = make_queue(tenants={"a": TenantConfig(max_queued_requests=2)})
    await occupy(q, engine)
    held = [spawn(q.admit(req("a"), deadline=far())) for _ in range(2)]
    await settle()
    with pytest.raises(AdmissionRejected) as exc:
        await q.admit(req("a"), deadline=far())
    assert exc.value.status == 429 and exc.value.reason == "queue_full" and exc.value.retry_after_s > 0
    assert q.snapshot()["tenants"]["a"]["rejections"] == {"queue_full": 1}
    for t in held:
        t.cancel()


async def test_follow_ups_of_an_entered_request_pass_the_bounds_and_precheck_refuses_up_front(make_queue):
    q, engine = make_queue(tenants={"a": TenantConfig(max_queued_requests=2)})
    await occupy(q, engine)
    first = q.enter(req("a"), deadline=far())           # the request's first part: bounds apply
    more = [q.enter(req("a"), deadline=far(), follow_up=True) for _ in range(4)]    # never refused for room
    assert q.snapshot()["tenants"]["a"]["queued"] == 5
    with pytest.raises(AdmissionRejected) as exc:
        q.precheck("a")                                 # a new request: refused before any work
    assert exc.value.status == 429 and exc.value.reason == "queue_full" and exc.value.retry_after_s > 0
    with pytest.raises(AdmissionRejected):
        q.enter(req("a"), deadline=far())
    q.precheck("b")                                     # other tenants are not affected
    for t in [first, *more]:
        q.withdraw(t)
        q.withdraw(t)                                   # idempotent
    assert q.snapshot()["tenants"]["a"]["queued"] == 0
    q.precheck("a")


async def test_a_request_of_several_parts_is_judged_whole_with_the_places_it_holds(make_queue):
    q, engine = make_queue(tenants={"a": TenantConfig(max_queued_requests=4)}, max_queued_requests=6)
    await occupy(q, engine)
    first = q.enter(req("a"), deadline=far(), hold=3)          # 1 queued + 3 held: the tenant's bound
    with pytest.raises(AdmissionRejected) as exc:
        q.precheck("a")
    assert exc.value.reason == "queue_full"
    with pytest.raises(AdmissionRejected):
        q.enter(req("a"), deadline=far())
    q.withdraw(first)
    q.release_hold("a", 3)
    one = q.enter(req("a"), deadline=far())
    q.precheck("a", hold=2)                                    # 1 queued + 3 of the next: room
    with pytest.raises(AdmissionRejected):
        q.precheck("a", hold=3)                                # 1 queued + 4 would pass the bound
    q.withdraw(one)
    first = q.enter(req("a"), deadline=far(), hold=3)
    parts = [q.enter(req("a"), deadline=far(), follow_up=True, from_hold=True) for _ in range(3)]
    assert q.snapshot()["tenants"]["a"]["queued"] == 4
    with pytest.raises(AdmissionRejected) as exc:              # the node: 4 queued + 2 held for b is 6
        q.enter(req("b"), deadline=far(), hold=2)
    assert exc.value.reason == "node_full"
    for t in [first, *parts]:
        q.withdraw(t)
    b = q.enter(req("b"), deadline=far(), hold=2)
    q.release_hold("b", 2)
    q.precheck("a")
    q.withdraw(b)


async def test_a_request_holding_more_than_its_tenant_may_queue_is_refused_unless_it_is_alone(make_queue):
    q, engine = make_queue(tenants={"a": TenantConfig(max_queued_requests=2)})
    await occupy(q, engine)
    alone = q.enter(req("a"), deadline=far(), hold=5)          # nothing of a's queued or held: it goes
    with pytest.raises(AdmissionRejected):
        q.enter(req("a"), deadline=far(), hold=5)
    q.withdraw(alone)
    q.release_hold("a", 5)


async def test_parts_of_a_request_are_never_shed_for_a_higher_class(make_queue):
    tenants = {"bat": TenantConfig(priority=PriorityClass.BATCH),
               "int": TenantConfig(priority=PriorityClass.INTERACTIVE)}
    q, engine = make_queue(tenants=tenants, max_queued_requests=2)
    await occupy(q, engine)
    first = q.enter(req("bat"), deadline=far(), hold=1)
    part = q.enter(req("bat"), deadline=far(), follow_up=True, from_hold=True)
    with pytest.raises(AdmissionRejected) as exc:              # nothing it may shed: refused itself
        q.enter(req("int"), deadline=far())
    assert exc.value.reason == "node_full" and first.state == part.state == QUEUED
    for t in (first, part):
        q.withdraw(t)


async def test_a_withdrawn_released_ticket_aborts_its_engine_request(make_queue):
    q, engine = make_queue()
    t = q.enter(req("a"), deadline=far())               # room: released to the engine at once
    assert engine.submitted and t.stream is not None
    q.withdraw(t)
    assert (await t.stream.collect()).finish_reason is FinishReason.ABORT


async def test_tenant_queued_tokens_bound_is_429_queue_full_and_leaves_other_tenants_alone(make_queue):
    # each request holds prompt 16 + max_tokens 8 = 24 tokens while queued; the bound is 50
    q, engine = make_queue(tenants={"a": TenantConfig(max_queued_tokens=50)})
    await occupy(q, engine)
    held = [spawn(q.admit(req("a"), deadline=far())) for _ in range(2)]       # 48 tokens queued
    await settle()
    with pytest.raises(AdmissionRejected) as exc:
        await q.admit(req("a"), deadline=far())                               # 72 > 50
    assert exc.value.status == 429 and exc.value.reason == "queue_full" and exc.value.retry_after_s > 0
    other = spawn(q.admit(req("b", prompt=64), deadline=far()))               # b's own bound is the default
    await settle()
    assert not other.done() and q.snapshot()["queued"] == 3
    assert q.snapshot()["tenants"]["a"]["rejections"] == {"queue_full": 1}
    for t in [*held, other]:
        t.cancel()


async def test_node_full_sheds_newest_batch_work_for_interactive(make_queue):
    tenants = {"bat": TenantConfig(priority=PriorityClass.BATCH),
               "int": TenantConfig(priority=PriorityClass.INTERACTIVE)}
    q, engine = make_queue(tenants=tenants, max_queued_requests=2)
    await occupy(q, engine)
    old, new = (spawn(q.admit(req("bat"), deadline=far())) for _ in range(2))
    await settle()
    with pytest.raises(AdmissionRejected) as exc:          # batch cannot evict batch
        await q.admit(req("bat"), deadline=far())
    assert exc.value.status == 503 and exc.value.reason == "node_full"
    interactive = spawn(q.admit(req("int"), deadline=far()))
    await settle()
    assert new.done() and new.exception().reason == "node_full" and not old.done()
    await drain_order(q, engine, [], 1)
    assert (await interactive).tenant == "int"
    old.cancel()


async def test_deadline_passing_in_queue_is_504(make_queue):
    q, engine = make_queue()
    await occupy(q, engine)
    with pytest.raises(AdmissionRejected) as exc:
        await q.admit(req("a"), deadline=asyncio.get_running_loop().time() + 0.02)
    assert exc.value.status == 504 and exc.value.reason == "deadline"


async def test_a_deadline_refusal_after_waiting_says_when_to_retry_from_the_wait(make_queue):
    loop = asyncio.get_running_loop()
    q, engine = make_queue()                              # no service rate known: the time it waited
    await occupy(q, engine)
    arrived = loop.time()
    with pytest.raises(AdmissionRejected) as exc:
        await q.admit(req("a"), deadline=arrived + 0.3)
    assert 0.28 <= exc.value.retry_after_s < 1.0 and exc.value.retry_after_header == "1"   # ~ its 0.3 s wait
    measured = FakeEngine(tokens_per_s=100.0)             # a rate: the estimated rest of the wait
    q, _ = make_queue(engine=measured, early_refusal=False)   # so it waits for its deadline in the queue
    await occupy(q, measured)
    held = [spawn(q.admit(req("a", prompt=100, max_tokens=50), deadline=far())) for _ in range(4)]
    await settle()                                        # 800 cost queued at 100/s: 8 s ahead of it
    with pytest.raises(AdmissionRejected) as exc:
        await q.admit(req("a", prompt=100, max_tokens=50), deadline=loop.time() + 0.05)
    assert (exc.value.status, exc.value.reason) == (504, "deadline") and exc.value.retry_after_s >= 4.0
    for t in held:
        t.cancel()


async def test_class_ttl_drops_queued_work_with_503(make_queue):
    q, engine = make_queue(standard_ttl_s=0.02)
    await occupy(q, engine)
    with pytest.raises(AdmissionRejected) as exc:
        await q.admit(req("a"), deadline=far())
    assert exc.value.status == 503 and exc.value.reason == "ttl" and exc.value.retry_after_header is not None


async def test_load_counts_queued_requests_by_class_and_says_when_the_node_queue_is_full(make_queue):
    tenants = {"bat": TenantConfig(priority=PriorityClass.BATCH),
               "int": TenantConfig(priority=PriorityClass.INTERACTIVE)}
    q, engine = make_queue(tenants=tenants, max_queued_requests=2)
    assert q.load() == QueueLoad(queued=(0, 0, 0), wait_s=0.0, cost_per_s=0.0, full=False)   # room now
    await occupy(q, engine)
    assert q.load().wait_s == UNKNOWN_WAIT_S             # it would wait, and no rate says how long
    held = [spawn(q.admit(req("bat"), deadline=far())), spawn(q.admit(req("int"), deadline=far()))]
    await settle()
    load = q.load()
    assert load.queued == (1, 0, 1) and load.full
    for t in held:
        t.cancel()


async def test_load_estimates_a_newcomers_wait_from_the_queued_cost_and_the_service_rate(make_queue):
    q, engine = make_queue(engine=FakeEngine(slots=1, tokens_per_s=100.0))
    await occupy(q, engine)
    held = spawn(q.admit(req("a"), deadline=far()))      # prompt 16 + expected output 8 * 2
    await settle()
    # queued 16 + 16 = 32, plus a typical request's output (16 * 2) for the running one to end
    assert q.load().wait_s == pytest.approx((32 + 32) / 100.0)
    held.cancel()
