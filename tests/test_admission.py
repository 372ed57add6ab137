import asyncio
import math

import pytest

from inferd.admission import AdmissionQueue, AdmissionRejected
from inferd.engine.base import Capacity, Engine, EngineInfo, EngineStats
from inferd.engine.stream import RequestStream
from inferd.quota import Quota
from inferd.tenants import AdmissionConfig, PriorityClass, TenantConfig, TenantRegistry, admission_errors
from inferd.types import Delta, FinishReason, GenerationRequest, SamplingParams, Usage

BS = 16


class FakeEngine(Engine):
    """capacity() reports what the test sets; submit() records; tests finish requests by hand.

    A submitted prompt counts as pending prefill until `prefilled()` or `finish()`."""

    def __init__(self, slots=1, blocks=100, tokens_per_s=0.0):
        self.info = EngineInfo(backend="fake", model_name="m", version="v", max_model_len=4096, block_size=BS,
                               num_kv_blocks=blocks, max_batch_size=slots, max_num_tokens=512)
        self.slots, self.free_blocks, self.waiting, self.tokens_per_s = slots, blocks, 0, tokens_per_s
        self.submitted: list[GenerationRequest] = []
        self.pending: dict[str, int] = {}
        self.streams: dict[str, RequestStream] = {}
        self.aborted: list[str] = []
        self.capacity_calls = 0
        self.submit_event = asyncio.Event()

    async def start(self): ...
    async def warmup(self): ...
    async def close(self): ...

    def submit(self, request):
        self.submitted.append(request)
        self.pending[request.request_id] = len(request.prompt_token_ids)
        self.slots -= 1
        self.free_blocks -= math.ceil(len(request.prompt_token_ids) / BS)
        stream = self.streams[request.request_id] = RequestStream(request.request_id, self.abort)
        self.submit_event.set()
        return stream

    def finish(self, request_id, n_out=3, reason=FinishReason.STOP):
        req = next(r for r in self.submitted if r.request_id == request_id)
        self.pending.pop(request_id, None)
        self.slots += 1
        self.free_blocks += math.ceil(len(req.prompt_token_ids) / BS)
        self.streams[request_id].push(Delta(token_ids=[7] * n_out, finish_reason=reason, usage=Usage(
            prompt_tokens=len(req.prompt_token_ids), completion_tokens=n_out)))

    def abort(self, request_id):
        self.aborted.append(request_id)
        if request_id in self.streams and not self.streams[request_id].finished:
            self.finish(request_id, n_out=0, reason=FinishReason.ABORT)

    def capacity(self):
        self.capacity_calls += 1
        return Capacity(free_kv_blocks=self.free_blocks, free_kv_tokens=self.free_blocks * BS,
                        free_slots=self.slots, waiting=self.waiting, block_size=BS,
                        pending_prefill_tokens=sum(self.pending.values()))

    def prefilled(self, request_id):
        """The request's prefill is done: its first token goes out."""
        self.pending.pop(request_id)
        self.streams[request_id].push(Delta(token_ids=[7]))

    def stats(self):
        return EngineStats(running=0, waiting=0, kv_blocks_total=0, kv_blocks_used=0, prefix_cache_hit_rate=0.0,
                           step_latency_s=0.0, steps_total=0, prompt_tokens_total=0, generation_tokens_total=0,
                           prefix_cache_hit_tokens_total=0, tokens_per_s=self.tokens_per_s)

    async def wait_submitted(self, n):
        while len(self.submitted) < n:
            self.submit_event.clear()
            await self.submit_event.wait()


_ids = iter(range(10**9))
_tasks: list[asyncio.Future] = []


def spawn(coro):
    """A background admit() that the fixture cancels and reaps at teardown."""
    task = asyncio.ensure_future(coro)
    _tasks.append(task)
    return task


def req(tenant, prompt=16, max_tokens=8):
    return GenerationRequest(request_id=f"r{next(_ids)}", prompt_token_ids=tuple(range(prompt)),
                             sampling=SamplingParams(max_tokens=max_tokens), tenant=tenant)


@pytest.fixture
async def make_queue():
    made = []

    def make(engine=None, tenants=None, **policy):
        engine = engine or FakeEngine()
        policy.setdefault("kv_reserve_fraction", 0.0)
        policy.setdefault("headroom_fraction", 0.0)
        q = AdmissionQueue(engine, AdmissionConfig(**policy), TenantRegistry(tenants or {}))
        q.start()
        made.append(q)
        return q, engine

    yield make
    for q in made:
        await q.close()
    for t in _tasks:
        t.cancel()
    await asyncio.gather(*_tasks, return_exceptions=True)
    _tasks.clear()


async def settle():
    """Let every ready callback run (the dispatcher reacts to events on the loop)."""
    for _ in range(5):
        await asyncio.sleep(0)


def far():
    return asyncio.get_running_loop().time() + 60


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


async def test_dispatcher_sleeps_when_idle(make_queue):
    q, engine = make_queue()
    await settle()
    calls = engine.capacity_calls
    await asyncio.sleep(0.05)                   # an idle queue must not poll the engine
    assert engine.capacity_calls == calls


async def occupy(q, engine):
    """Fill the single engine slot so later requests queue."""
    return await q.admit(req("blocker"), deadline=far())


async def drain_order(q, engine, tickets, n):
    """Release n queued requests one at a time; return their tenants in release order."""
    order = []
    running = engine.submitted[-1].request_id
    for _ in range(n):
        before = len(engine.submitted)
        engine.finish(running)
        await engine.wait_submitted(before + 1)
        running = engine.submitted[-1].request_id
        order.append(engine.submitted[-1].tenant)
    return order


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


async def test_class_ttl_drops_queued_work_with_503(make_queue):
    q, engine = make_queue(standard_ttl_s=0.02)
    await occupy(q, engine)
    with pytest.raises(AdmissionRejected) as exc:
        await q.admit(req("a"), deadline=far())
    assert exc.value.status == 503 and exc.value.reason == "ttl" and exc.value.retry_after_header is not None


async def test_hopeless_deadline_is_refused_at_once_from_the_wait_estimate(make_queue):
    engine = FakeEngine(tokens_per_s=100.0)                 # cost/s until admission measures its own
    q, _ = make_queue(engine=engine, early_refusal_fraction=1.0)
    await occupy(q, engine)
    held = [spawn(q.admit(req("a", prompt=100, max_tokens=50), deadline=far()))
            for _ in range(4)]                              # 4 x (100 + 2*50) = 800 cost = 8 s of work
    await settle()
    loop = asyncio.get_running_loop()
    # b is served after only its fair share of a's backlog (200 cost = 2 s): 1 s is not enough.
    with pytest.raises(AdmissionRejected) as exc:
        await q.admit(req("b", prompt=100, max_tokens=50), deadline=loop.time() + 1.0)
    assert exc.value.reason == "deadline" and exc.value.status == 503
    assert exc.value.retry_after_s == pytest.approx(1.0, rel=0.05)   # ~2 s of wait - 1 s of budget
    with pytest.raises(AdmissionRejected) as own:                  # behind its own 8 s backlog: 429
        await q.admit(req("a", prompt=100, max_tokens=50), deadline=loop.time() + 2.0)
    assert own.value.status == 429 and own.value.retry_after_s == pytest.approx(6.0, rel=0.05)
    ok = spawn(q.admit(req("b", prompt=100, max_tokens=50), deadline=loop.time() + 3.0))
    await settle()
    assert not ok.done()                                    # enough budget: queued
    for t in held + [ok]:
        t.cancel()


async def test_deadline_while_generating_aborts_and_final_chunk_says_deadline(make_queue):
    q, engine = make_queue()
    stream = await q.admit(req("a"), deadline=asyncio.get_running_loop().time() + 0.02)
    final = await stream.collect()
    assert final.finish_reason is FinishReason.DEADLINE and engine.aborted == [stream.request_id]


async def test_output_is_charged_to_the_counter_as_it_streams(make_queue):
    q, engine = make_queue(tenants={"a": TenantConfig(weight=2)})
    stream = await q.admit(req("a", prompt=32), deadline=far())
    assert q.counters["a"] == pytest.approx(32 / 2)
    engine.streams[stream.request_id].push(Delta(token_ids=[1, 2, 3]))
    await stream.__anext__()
    assert q.counters["a"] == pytest.approx((32 + 2 * 3) / 2)
    engine.finish(stream.request_id, n_out=1)
    await stream.collect()
    snap = q.snapshot()["tenants"]["a"]
    assert snap["output_tokens"] == 4 and snap["ttft_count"] == 1 and snap["admitted"] == 1


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
    q, _ = make_queue(engine=engine, headroom_fraction=0.25)          # 1 of 4 slots
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
    q, _ = make_queue(engine=engine, headroom_fraction=0.25)          # 2 of 8 slots
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
