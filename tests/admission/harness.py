"""The admission queue's test harness: an engine double whose capacity the test sets, and a queue
factory that cleans up (shared by tests/admission/test_*.py)."""
import asyncio
import math

import pytest

from inferd.admission.fair_queue import AdmissionQueue
from inferd.config.tenants import AdmissionConfig, TenantRegistry
from inferd.engine.base import Capacity, Engine, EngineInfo, EngineStats
from inferd.engine.stream import RequestStream
from inferd.types import Delta, FinishReason, GenerationRequest, SamplingParams, Usage

BS = 16


class FakeEngine(Engine):
    """capacity() reports what the test sets; submit() records; tests finish requests by hand.

    A submitted prompt counts as pending prefill until `prefilled()` or `finish()`. With `yields`, it can
    preempt (Engine.yields_slots): yield_slot parks a request (its slot counted free, itself as parked)
    until `resume()`; like the reference engine, the step in flight when the yield is asked still delivers
    one more token for it. `steps` is what stats() reports as steps_total."""

    def __init__(self, slots=1, blocks=100, tokens_per_s=0.0, yields=False):
        self.info = EngineInfo(backend="fake", model_name="m", version="v", max_model_len=4096, block_size=BS,
                               num_kv_blocks=blocks, max_batch_size=slots, max_num_tokens=512)
        self.slots, self.free_blocks, self.waiting, self.tokens_per_s = slots, blocks, 0, tokens_per_s
        self.submitted: list[GenerationRequest] = []
        self.pending: dict[str, int] = {}
        self.streams: dict[str, RequestStream] = {}
        self.aborted: list[str] = []
        self.capacity_calls = 0
        self.capacity_event = asyncio.Event()
        self.submit_event = asyncio.Event()
        self.yields_slots = yields
        self.yielded: list[str] = []
        self.parked: set[str] = set()
        self.steps = 0

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

    def yield_slot(self, request_id):
        stream = self.streams.get(request_id)
        if not self.yields_slots or stream is None or stream.finished or request_id in self.parked:
            return False
        self.yielded.append(request_id)
        self.parked.add(request_id)
        self.slots += 1
        asyncio.get_running_loop().call_soon(stream.push, Delta(token_ids=[7]))   # the step in flight
        return True

    def resume(self, request_id):
        """A parked request takes a slot again and delivers a token."""
        self.parked.remove(request_id)
        self.slots -= 1
        self.streams[request_id].resumed()
        self.streams[request_id].push(Delta(token_ids=[7]))

    def finish(self, request_id, n_out=3, reason=FinishReason.STOP):
        req = next(r for r in self.submitted if r.request_id == request_id)
        self.pending.pop(request_id, None)
        if request_id in self.parked:
            self.parked.remove(request_id)
            self.slots -= 1
            self.streams[request_id].resumed()
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
        self.capacity_event.set()
        return Capacity(free_kv_blocks=self.free_blocks, free_kv_tokens=self.free_blocks * BS,
                        free_slots=self.slots, waiting=self.waiting, block_size=BS,
                        pending_prefill_tokens=sum(self.pending.values()), parked=len(self.parked))

    def prefilled(self, request_id):
        """The request's prefill is done: its first token goes out."""
        self.pending.pop(request_id)
        self.streams[request_id].push(Delta(token_ids=[7]))

    def stats(self):
        return EngineStats(running=0, waiting=0, kv_blocks_total=0, kv_blocks_used=0, prefix_cache_hit_rate=0.0,
                           step_latency_s=0.0, steps_total=self.steps, prompt_tokens_total=0, generation_tokens_total=0,
                           prefix_cache_hit_tokens_total=0, tokens_per_s=self.tokens_per_s)

    async def dispatcher_passes(self, n=3):
        """Wait until the dispatcher has asked for capacity `n` more times: at least one whole pass that
        began after this call, so a negative assertion after it tests what that pass decided."""
        target = self.capacity_calls + n
        while self.capacity_calls < target:
            self.capacity_event.clear()
            await asyncio.wait_for(self.capacity_event.wait(), 5)

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

    def make(engine=None, tenants=None, clock=None, **policy):
        engine = engine or FakeEngine()
        policy.setdefault("kv_reserve_fraction", 0.0)
        policy.setdefault("headroom_fraction", 0.0)
        kwargs = {} if clock is None else {"clock": clock}
        q = AdmissionQueue(engine, AdmissionConfig(**policy), TenantRegistry(tenants or {}), **kwargs)
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
