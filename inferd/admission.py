"""The per-engine admission queue: weighted-fair order, deadlines, bounds, and a capacity-gated dispatcher.

One FIFO per tenant. The next request released is picked by priority class (interactive > standard >
batch, with a share of served cost reserved for each lower class while it waits) and, within a class,
by the weighted virtual token counter (VTC, Sheng et al. 2024): the backlogged tenant with the smallest
counter goes next. A tenant's counter grows by served cost / weight; cost = prompt * prompt_cost_weight
(charged at dispatch, when the prefill is committed) + output * output_cost_weight (charged as the
stream delivers tokens, so a tenant's long generations count against it while they run, not only after
they end; the final delta's usage settles the exact total). A tenant that becomes backlogged again is
lifted to the smallest counter among backlogged tenants, so idling never banks credit.

The dispatcher is a task woken by submissions, first tokens and finishing streams, plus a short poll
while blocked on engine capacity (capacity also frees on engine steps). It releases a request only when
the engine has a free slot, KV blocks for the prompt plus a reserve, its own waiting queue is below a
small bound, and the prompt tokens it has not computed yet (queued or part-prefilled) plus this prompt
fit the prefill budget (a longer prompt goes when nothing is pending, so nothing starves): whatever
reaches the engine is, by construction, the fair next request.

Why the prefill budget: the engine is FCFS inside and packs prefill chunks into steps of up to
max_num_tokens. Without the bound, a flooding tenant's prefills fill every step, and a light tenant's
prefill, even when released first, queues behind them and shares steps several times longer than a
decode step. With it, a light tenant's prompt (below) joins at most a budget's worth of pending
prefill and is computed in the engine's next step, one carrying little more than its own prefill.

Light tenants: one with fewer requests queued + running than its weighted share of the engine's slots
(among the tenants with work in flight) is owed service, so within its class it goes before heavier
tenants whatever the counters say, and when the picked request cannot go yet (no slot beyond the
headroom, no room in the prefill budget) a light tenant's request that fits goes instead. Its prompt
may join pending prefill up to a whole step (max_num_tokens), and it needs no KV reserve. While a light
tenant has arrived recently beside backlogged ones, heavier tenants leave the last `headroom_fraction`
of slots free, so a well-behaved tenant next to a flooding one starts at once instead of waiting for a
slot to free. With only heavy tenants around, no headroom is held and the engine is filled completely.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable

from inferd.engine.base import Engine, InvalidRequest
from inferd.engine.stream import RequestStream, merge_deltas
from inferd.quota import Lease
from inferd.tenants import CLASSES_BY_RANK, AdmissionConfig, PriorityClass, TenantRegistry
from inferd.types import Delta, FinishReason, GenerationRequest, Usage

Clock = Callable[[], float]
_QUEUED, _DISPATCHED, _DONE = 0, 1, 2
MIN_RETRY_S = 0.05
UNKNOWN_RETRY_S = 1.0          # Retry-After before any throughput has been measured


class AdmissionRejected(Exception):
    """The request was not (or no longer) admitted. status: 429 queue_full / own backlog too deep for
    the deadline; 503 node_full / shed / deadline / ttl / draining; 504 deadline passed while queued."""

    def __init__(self, message: str, *, status: int, reason: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> str | None:
        """`Retry-After` value (whole seconds, at least 1) or None."""
        return None if self.retry_after_s is None else str(max(1, math.ceil(self.retry_after_s)))


class _Ticket:
    __slots__ = ("request", "tenant", "cls", "prompt", "tokens", "est_cost", "deadline", "expires",
                 "arrived", "seq", "future", "timer", "state", "lease")

    def __init__(self, request: GenerationRequest, cls: PriorityClass, est_cost: float, deadline: float,
                 expires: float, arrived: float, seq: int, lease: Lease | None) -> None:
        self.request = request
        self.tenant = request.tenant
        self.cls = cls
        self.prompt = len(request.prompt_token_ids)
        self.tokens = self.prompt + request.sampling.max_tokens
        self.est_cost = est_cost
        self.deadline = deadline
        self.expires = expires          # min(deadline, enqueue + class TTL)
        self.arrived = arrived
        self.seq = seq
        self.future: asyncio.Future[AdmittedStream] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.state = _QUEUED
        self.lease = lease


class _TenantStats:
    __slots__ = ("admitted", "rejections", "prompt_tokens", "output_tokens", "wait_sum", "wait_n",
                 "ttft_sum", "ttft_n")

    def __init__(self) -> None:
        self.admitted = 0
        self.rejections: dict[str, int] = {}
        self.prompt_tokens = self.output_tokens = 0
        self.wait_sum = self.ttft_sum = 0.0
        self.wait_n = self.ttft_n = 0


class AdmittedStream:
    """The engine's RequestStream for an admitted request, with admission's bookkeeping on top: output
    cost charged as tokens arrive, TTFT, and the deadline while generating (engine.abort, then the
    final delta's finish_reason is DEADLINE). Same consumer interface as RequestStream."""

    def __init__(self, queue: AdmissionQueue, ticket: _Ticket, stream: RequestStream, queue_wait_s: float) -> None:
        self._queue = queue
        self._ticket = ticket
        self._stream = stream
        self.request_id = stream.request_id
        self.tenant = ticket.tenant
        self.queue_wait_s = queue_wait_s
        self.deadline_hit = False
        self._output = 0
        self._first_token = False
        self._closed = False
        self._deadline_timer: asyncio.TimerHandle | None = None

    def __aiter__(self) -> AdmittedStream:
        return self

    async def __anext__(self) -> Delta:
        return self._seen(await self._stream.__anext__())

    def take(self) -> Delta | None:
        """RequestStream.take with the same bookkeeping (for a writer that reads on a listener)."""
        delta = self._stream.take()
        return None if delta is None else self._seen(delta)

    def listen(self, listener: Callable[[], None] | None) -> None:
        self._stream.listen(listener)

    def _seen(self, delta: Delta) -> Delta:
        if delta.token_ids:
            if not self._first_token:
                self._first_token = True
                self._queue._record_ttft(self._ticket)
            self._output += len(delta.token_ids)
            self._queue._charge_output(self._ticket, len(delta.token_ids))
        if delta.finish_reason is not None:
            if self.deadline_hit and delta.finish_reason is FinishReason.ABORT:
                delta.finish_reason = FinishReason.DEADLINE
            self._close(delta.usage)
        return delta

    async def collect(self) -> Delta:
        return merge_deltas([d async for d in self])

    def ready(self) -> bool:
        return self._stream.ready()

    @property
    def finished(self) -> bool:
        return self._stream.finished

    def cancel(self) -> None:
        """The consumer is going away: abort in the engine and give back everything held."""
        self._stream.cancel()
        self._close(None)

    def _on_deadline(self) -> None:
        if not self._stream.finished:
            self.deadline_hit = True
            self._queue.engine.abort(self.request_id)

    def _close(self, usage: Usage | None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        complete = usage is not None
        if usage is None:
            usage = Usage(prompt_tokens=self._ticket.prompt, completion_tokens=self._output)
        elif usage.completion_tokens > self._output:   # settle what merged deltas did not show
            self._queue._charge_output(self._ticket, usage.completion_tokens - self._output)
        self._queue._finished(self._ticket, usage, complete)


class AdmissionQueue:
    """Admission for one engine. Loop-thread only; `start()` inside the running loop."""

    def __init__(self, engine: Engine, policy: AdmissionConfig, tenants: TenantRegistry, *,
                 clock: Clock = time.monotonic, time_scale: float = 1.0) -> None:
        """`clock` gives deadlines' time base. `time_scale` = loop seconds per clock second: 1 for a real
        engine; a sim engine's time_scale when `clock` runs in simulated time (benchmarks)."""
        self.engine = engine
        self._time_scale = time_scale
        self._last_light = -math.inf
        self.policy = policy
        self.tenants = tenants
        self._clock = clock
        self._queues: dict[str, deque[_Ticket]] = {}
        self._queued_cost: dict[str, float] = {}
        self._queued_tokens: dict[str, int] = {}
        self._total_requests = 0
        self._total_tokens = 0
        self.counters: dict[str, float] = {}          # VTC, per tenant
        self._floor = 0.0                             # last min counter of the backlogged tenants
        self._class_served = {c: 0.0 for c in CLASSES_BY_RANK}
        self._served_total = 0.0
        self._class_mark: dict[PriorityClass, tuple[float, float]] = {}
        self._class_count = {c: 0 for c in CLASSES_BY_RANK}
        self._kv_in_flight: dict[str, int] = {}
        self._running = 0
        self._in_flight: dict[str, int] = {}         # running requests per tenant
        self._stats: dict[str, _TenantStats] = {}
        self._seq = 0
        self._avg_output: float | None = None
        self._thr_ema: float | None = None            # served cost per second, measured
        self._win_start = clock()
        self._win_cost = 0.0
        self._win_saturated = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="admission-dispatcher")

    async def close(self) -> None:
        """Stop dispatching; every queued request gets 503 `draining`. Running streams are untouched."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for q in list(self._queues.values()):
            for t in list(q):
                self._reject_queued(t, AdmissionRejected("server is draining", status=503, reason="draining",
                                                         retry_after_s=UNKNOWN_RETRY_S))

    def set_tenants(self, tenants: TenantRegistry) -> None:
        self.tenants = tenants

    # -- the caller's side ----------------------------------------------------------------
    async def admit(self, request: GenerationRequest, *, deadline: float, priority: PriorityClass | None = None,
                    lease: Lease | None = None) -> AdmittedStream:
        """Wait until `request` is released to the engine; returns its stream. `deadline` is absolute on
        this queue's clock. Raises AdmissionRejected, or the engine's InvalidRequest / EngineUnavailable.
        `lease` (from quota.acquire) is released when the request ends or is refused. Cancelling the
        caller removes the request from the queue (or aborts it if it was just released)."""
        try:
            t = self._enter(request, deadline, priority, lease)
        except BaseException:
            if lease is not None:
                lease.release(None)
            raise
        if t.future is None:            # released at once: nothing queued, engine has room
            return self._submit(t)
        try:
            return await t.future
        except asyncio.CancelledError:
            if t.state == _QUEUED:
                self._remove(t)
                self._settle(t, None)
            elif t.future.done() and not t.future.cancelled() and t.future.exception() is None:
                t.future.result().cancel()
            raise

    def _enter(self, request: GenerationRequest, deadline: float, priority: PriorityClass | None,
               lease: Lease | None) -> _Ticket:
        if self._closing:
            raise AdmissionRejected("server is draining", status=503, reason="draining",
                                    retry_after_s=UNKNOWN_RETRY_S)
        now = self._clock()
        cfg = self.tenants.get(request.tenant)
        cls = priority or cfg.priority
        self._seq += 1
        t = _Ticket(request, cls, self._estimate_cost(request), deadline,
                    min(deadline, now + self.policy.ttl_s(cls)), now, self._seq, lease)
        bs, total = self.engine.info.block_size, self.engine.info.num_kv_blocks
        if math.ceil(t.prompt / bs) > total:
            raise InvalidRequest(f"prompt of {t.prompt} tokens needs more KV blocks than the engine has",
                                 param="messages")
        if deadline <= now:
            self._reject(t, "deadline", 504, None, "the request's deadline passed before it could start")
        q = self._queues.get(t.tenant)
        if q and (len(q) >= cfg.max_queued_requests
                  or self._queued_tokens[t.tenant] + t.tokens > cfg.max_queued_tokens):
            overflow = max(1 / len(q), (self._queued_tokens[t.tenant] + t.tokens - cfg.max_queued_tokens)
                           / max(1, self._queued_tokens[t.tenant]))
            self._reject(t, "queue_full", 429, self._retry(self._wait_estimate(t, own_only=True), overflow),
                         f"tenant {t.tenant!r} has too many requests queued")
        if self._total_requests and self._is_light(t.tenant):
            self._last_light = now      # a light tenant arrived while others are backlogged: keep headroom
        if not q and self._total_requests == 0 and self._dispatchable(t) and self._fits(self.engine.capacity(), t):
            self._activate(t.tenant)
            return t
        if self.policy.early_refusal:
            wait, own = self._wait_estimate(t, split=True)
            budget = (t.expires - now) * self.policy.early_refusal_fraction
            if wait > budget:
                reason = "deadline" if t.deadline <= t.expires else "ttl"
                self._reject(t, reason, 429 if own >= wait / 2 else 503, wait - budget,
                             f"estimated queue wait {wait:.2f}s exceeds the request's {budget:.2f}s budget")
        if (self._total_requests >= self.policy.max_queued_requests
                or self._total_tokens + t.tokens > self.policy.max_queued_tokens):
            self._make_room(t)
        self._enqueue(t)
        return t

    # -- queue state ----------------------------------------------------------------------
    def _enqueue(self, t: _Ticket) -> None:
        q = self._queues.get(t.tenant)
        if not q:
            self._activate(t.tenant)
            q = self._queues[t.tenant] = deque()
            self._queued_cost[t.tenant] = 0.0
            self._queued_tokens[t.tenant] = 0
        if not self._class_count[t.cls]:     # the class becomes backlogged: its reserved share counts from now
            self._class_mark[t.cls] = (self._class_served[t.cls], self._served_total)
        self._class_count[t.cls] += 1
        q.append(t)
        self._queued_cost[t.tenant] += t.est_cost
        self._queued_tokens[t.tenant] += t.tokens
        self._total_requests += 1
        self._total_tokens += t.tokens
        t.future = asyncio.get_running_loop().create_future()
        t.timer = asyncio.get_running_loop().call_later(
            max(0.0, t.expires - self._clock()) * self._time_scale, self._expire, t)
        self._wake.set()

    def _remove(self, t: _Ticket) -> None:
        self._queues[t.tenant].remove(t)
        self._queued_cost[t.tenant] -= t.est_cost
        self._queued_tokens[t.tenant] -= t.tokens
        self._total_requests -= 1
        self._total_tokens -= t.tokens
        t.state = _DONE
        if t.timer is not None:
            t.timer.cancel()
        self._class_count[t.cls] -= 1
        if not self._class_count[t.cls]:
            self._class_mark.pop(t.cls, None)

    def _activate(self, tenant: str) -> None:
        """Lift a tenant that was not backlogged to the backlogged minimum: no credit banked while idle."""
        backlogged = [self.counters.get(n, 0.0) for n, q in self._queues.items() if q and n != tenant]
        floor = min(backlogged) if backlogged else self._floor
        self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)

    def _stat(self, tenant: str) -> _TenantStats:
        label = self.tenants.label(tenant)
        st = self._stats.get(label)
        if st is None:
            st = self._stats[label] = _TenantStats()
        return st

    # -- rejections -----------------------------------------------------------------------
    def _reject(self, t: _Ticket, reason: str, status: int, retry: float | None, message: str) -> None:
        st = self._stat(t.tenant)
        st.rejections[reason] = st.rejections.get(reason, 0) + 1
        raise AdmissionRejected(message, status=status, reason=reason, retry_after_s=retry)

    def _reject_queued(self, t: _Ticket, exc: AdmissionRejected) -> None:
        self._remove(t)
        st = self._stat(t.tenant)
        st.rejections[exc.reason] = st.rejections.get(exc.reason, 0) + 1
        self._settle(t, None)
        if t.future is not None and not t.future.done():
            t.future.set_exception(exc)

    def _settle(self, t: _Ticket, usage: Usage | None) -> None:
        t.state = _DONE
        if t.lease is not None:
            t.lease.release(usage)

    def _expire(self, t: _Ticket) -> None:
        if t.state != _QUEUED:
            return
        if t.deadline <= t.expires:
            exc = AdmissionRejected("the request's deadline passed while it was queued", status=504,
                                    reason="deadline", retry_after_s=None)
        else:
            exc = AdmissionRejected(f"queued longer than the {t.cls.value} class allows", status=503,
                                    reason="ttl", retry_after_s=self._retry(self._wait_estimate(t), 0.0))
        self._reject_queued(t, exc)

    def _make_room(self, t: _Ticket) -> None:
        """Node full: evict queued work of lower classes (batch first; within a class the tenant most
        over its share, newest request first) if that frees enough; else refuse the newcomer (503)."""
        victims: list[_Ticket] = []
        need_req = self._total_requests + 1 - self.policy.max_queued_requests
        need_tok = self._total_tokens + t.tokens - self.policy.max_queued_tokens
        for cls in reversed(CLASSES_BY_RANK):
            if cls.rank <= t.cls.rank:
                break
            tenants = sorted((n for n, q in self._queues.items() if q and q[0].cls is cls),
                             key=lambda n: -self.counters.get(n, 0.0))
            for n in tenants:
                for v in reversed(self._queues[n]):
                    if need_req <= 0 and need_tok <= 0:
                        break
                    victims.append(v)
                    need_req -= 1
                    need_tok -= v.tokens
        if need_req > 0 or need_tok > 0:
            overflow = max(1 / max(1, self._total_requests),
                           (self._total_tokens + t.tokens - self.policy.max_queued_tokens) / max(1, self._total_tokens))
            thr = self._throughput_or_none()
            self._reject(t, "node_full", 503, self._retry(self._total_work() / thr if thr else 0.0, overflow),
                         "the node's queue is full")
        for v in victims:
            self._reject_queued(v, AdmissionRejected("shed for higher-priority work: the node's queue is full",
                                                     status=503, reason="node_full",
                                                     retry_after_s=self._retry(self._wait_estimate(v), 0.0)))

    # -- estimates ------------------------------------------------------------------------
    def _estimate_cost(self, r: GenerationRequest) -> float:
        out = r.sampling.max_tokens if self._avg_output is None else min(r.sampling.max_tokens, self._avg_output)
        return len(r.prompt_token_ids) * self.policy.prompt_cost_weight + out * self.policy.output_cost_weight

    def _throughput_or_none(self) -> float | None:
        if self._thr_ema:
            return self._thr_ema
        tps = self.engine.stats().tokens_per_s
        return tps if tps > 0 else None

    def _total_work(self) -> float:
        return sum(self._queued_cost.values())

    def _wait_estimate(self, t: _Ticket, *, own_only: bool = False, split: bool = False):
        """Seconds until `t` would start: the queued cost VTC serves before it / measured throughput.
        Higher classes go first; in its class each other tenant v is served up to w_v/w_t of ours."""
        thr = self._throughput_or_none()
        own = sum(x.est_cost for x in self._queues.get(t.tenant, ()) if x.seq < t.seq)
        work = 0.0
        if not own_only:
            w_t = self.tenants.get(t.tenant).weight
            for n, q in self._queues.items():
                if not q or n == t.tenant:
                    continue
                if self.policy.scheduling == "fcfs":
                    work += sum(x.est_cost for x in q if x.seq < t.seq)
                elif q[0].cls.rank < t.cls.rank:
                    work += self._queued_cost[n]
                elif q[0].cls is t.cls:
                    work += min(self._queued_cost[n], (own + t.est_cost) * self.tenants.get(n).weight / w_t)
        if thr is None:
            return (0.0, 0.0) if split else 0.0
        return ((own + work) / thr, own / thr) if split else (own + work) / thr

    def _retry(self, drain_s: float, fraction: float) -> float:
        """Retry-After: the time for enough of the queue to drain that this request would fit."""
        if not self._throughput_or_none():
            return UNKNOWN_RETRY_S
        return max(MIN_RETRY_S, drain_s * min(1.0, max(fraction, 0.0)) if fraction else drain_s)

    def _note_served(self, cost: float) -> None:
        now = self._clock()
        self._win_cost += cost
        span = now - self._win_start
        if span >= 0.25:
            rate = self._win_cost / span
            if self._win_saturated or self._thr_ema is None:
                # Only a saturated window measures capacity; an idle one is only a lower bound.
                self._thr_ema = rate if self._thr_ema is None else self._thr_ema + 0.3 * (rate - self._thr_ema)
            else:
                self._thr_ema = max(self._thr_ema, rate)
            self._win_start, self._win_cost, self._win_saturated = now, 0.0, False

    # -- dispatch -------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._wake.clear()
            blocked = self._dispatch()
            if blocked:
                self._win_saturated = True
                try:   # capacity also frees on engine steps, which send no event
                    await asyncio.wait_for(self._wake.wait(), self.policy.poll_interval_s)
                except asyncio.TimeoutError:
                    pass
            else:
                await self._wake.wait()

    def _dispatch(self) -> bool:
        """Release requests while the engine has room. True if work is waiting on capacity."""
        while self._total_requests:
            t = self._pick()
            if t is None:
                return True
            cap = self.engine.capacity()
            if not self._fits(cap, t):
                if self.policy.scheduling == "fcfs" or self._is_light(t.tenant):
                    return True
                t = self._pick(light_only=True)       # the headroom is kept for them: no waiting behind t
                if t is None or not self._fits(cap, t):
                    return True
            self._remove(t)
            stream = self._submit(t)
            if stream is not None:
                t.future.set_result(stream)
        return False

    def _is_light(self, tenant: str) -> bool:
        """Fewer requests queued + running than its weighted share of the engine's slots, among the
        tenants with work in flight (itself included)."""
        active = {n for n, q in self._queues.items() if q} | {n for n, c in self._in_flight.items() if c}
        active.add(tenant)
        weight = self.tenants.get(tenant).weight
        share = weight / sum(self.tenants.get(n).weight for n in active) * self.engine.info.max_batch_size
        return len(self._queues.get(tenant, ())) + self._in_flight.get(tenant, 0) < share

    def _prefill_budget(self) -> int:
        budget = self.policy.max_pending_prefill_tokens
        return budget if budget is not None else max(1, self.engine.info.max_num_tokens // 4)

    def _fits(self, cap, t: _Ticket) -> bool:
        need = math.ceil(t.prompt / cap.block_size)
        if cap.free_slots < 1 or cap.waiting >= self.policy.max_engine_waiting:
            return False
        light = self._is_light(t.tenant)
        # The prefill budget is headroom too: a light tenant's prompt may join what is pending up to a
        # step's worth of tokens, so it is computed in the engine's next step instead of after it.
        budget = self._prefill_budget()
        limit = max(budget, self.engine.info.max_num_tokens) if light else budget
        if cap.pending_prefill_tokens and cap.pending_prefill_tokens + t.prompt > limit:
            return False
        if light:
            return cap.free_kv_blocks >= need
        info = self.engine.info
        reserve = math.ceil(self.policy.kv_reserve_fraction * info.num_kv_blocks)
        headroom = 0
        if self._clock() - self._last_light < self.policy.headroom_window_s:
            headroom = int(self.policy.headroom_fraction * info.max_batch_size)   # < all slots
        return cap.free_slots > headroom and cap.free_kv_blocks >= min(need + reserve, info.num_kv_blocks)

    def _dispatchable(self, t: _Ticket) -> bool:
        cap = self.tenants.get(t.tenant).max_kv_tokens_in_flight
        used = self._kv_in_flight.get(t.tenant, 0)
        return cap is None or used == 0 or used + t.tokens <= cap

    def _pick(self, light_only: bool = False) -> _Ticket | None:
        heads = []
        for n, q in self._queues.items():
            while q and q[0].future is not None and q[0].future.done():   # caller gone: drop at dequeue
                gone = q[0]
                self._remove(gone)
                self._settle(gone, None)
            if q and self._dispatchable(q[0]) and (not light_only or self._is_light(n)):
                heads.append(q[0])
        if not heads:
            return None
        if self.policy.scheduling == "fcfs":
            return min(heads, key=lambda x: x.seq)
        backlogged = {h.cls for h in heads}
        cls = min(backlogged, key=lambda c: c.rank)
        for lower in CLASSES_BY_RANK[cls.rank + 1:]:
            mark = self._class_mark.get(lower)
            if lower in backlogged and mark is not None and (
                    self._class_served[lower] - mark[0] < self.policy.reserved_share(lower) * (self._served_total - mark[1])):
                cls = lower
                break
        in_class = [h for h in heads if h.cls is cls]
        self._floor = max(self._floor, min(self.counters.get(h.tenant, 0.0) for h in heads))
        # Light tenants (under their share of slots) first: a tenant using less than its share is owed
        # service, so it need not wait behind one using more, even right after its own counter moved
        # past theirs. Then the counter; ties (a tenant just lifted) go to the shorter queue.
        return min(in_class, key=lambda h: (not self._is_light(h.tenant), self.counters.get(h.tenant, 0.0),
                                            len(self._queues[h.tenant]), h.seq))

    def _submit(self, t: _Ticket) -> AdmittedStream | None:
        """Hand `t` to the engine. On an engine error a queued caller gets it through its future
        (and None is returned); a caller released at once gets it raised."""
        try:
            stream = self.engine.submit(t.request)
        except Exception as exc:
            self._settle(t, None)
            if t.future is not None:
                t.future.set_exception(exc)
                return None
            raise
        now = self._clock()
        t.state = _DISPATCHED
        self._running += 1
        self._in_flight[t.tenant] = self._in_flight.get(t.tenant, 0) + 1
        self._kv_in_flight[t.tenant] = self._kv_in_flight.get(t.tenant, 0) + t.tokens
        self._charge(t, t.prompt * self.policy.prompt_cost_weight)
        st = self._stat(t.tenant)
        st.admitted += 1
        st.prompt_tokens += t.prompt
        st.wait_sum += now - t.arrived
        st.wait_n += 1
        admitted = AdmittedStream(self, t, stream, now - t.arrived)
        if t.deadline < math.inf:
            admitted._deadline_timer = asyncio.get_running_loop().call_later(
                max(0.0, t.deadline - now) * self._time_scale, admitted._on_deadline)
        return admitted

    # -- accounting from running streams -------------------------------------------------
    def _charge(self, t: _Ticket, cost: float) -> None:
        self.counters[t.tenant] = self.counters.get(t.tenant, 0.0) + cost / self.tenants.get(t.tenant).weight
        self._class_served[t.cls] += cost
        self._served_total += cost
        self._note_served(cost)

    def _charge_output(self, t: _Ticket, n: int) -> None:
        self._stat(t.tenant).output_tokens += n
        self._charge(t, n * self.policy.output_cost_weight)

    def _record_ttft(self, t: _Ticket) -> None:
        st = self._stat(t.tenant)
        st.ttft_sum += self._clock() - t.arrived
        st.ttft_n += 1
        self._wake.set()       # its prefill is done: pending prefill went down, the next may fit

    def _finished(self, t: _Ticket, usage: Usage, complete: bool) -> None:
        self._running -= 1
        self._in_flight[t.tenant] -= 1
        self._kv_in_flight[t.tenant] -= t.tokens
        if complete:    # a cancelled stream's partial output would bias the expected output length down
            out = usage.completion_tokens
            self._avg_output = out if self._avg_output is None else self._avg_output + 0.1 * (out - self._avg_output)
        self._settle(t, usage)
        self._wake.set()

    # -- observability --------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Values for the Prometheus series (see docs/tenants.md), keyed by bounded tenant label."""
        tenants: dict[str, dict] = {}
        for label, st in self._stats.items():
            tenants[label] = {"admitted": st.admitted, "rejections": dict(st.rejections),
                              "prompt_tokens": st.prompt_tokens, "output_tokens": st.output_tokens,
                              "queue_wait_sum_s": st.wait_sum, "queue_wait_count": st.wait_n,
                              "ttft_sum_s": st.ttft_sum, "ttft_count": st.ttft_n,
                              "queued": 0, "queued_tokens": 0, "vtc": 0.0}
        empty = {"admitted": 0, "rejections": {}, "prompt_tokens": 0, "output_tokens": 0,
                 "queue_wait_sum_s": 0.0, "queue_wait_count": 0, "ttft_sum_s": 0.0, "ttft_count": 0}
        for name, counter in self.counters.items():
            row = tenants.setdefault(self.tenants.label(name), {**empty, "rejections": {}, "queued": 0,
                                                                 "queued_tokens": 0, "vtc": 0.0})
            row["vtc"] = max(row["vtc"], counter)
        classes = {c.value: {"queued": 0, "queued_tokens": 0} for c in CLASSES_BY_RANK}
        for name, q in self._queues.items():
            for t in q:
                tenants[self.tenants.label(name)]["queued"] += 1
                tenants[self.tenants.label(name)]["queued_tokens"] += t.tokens
                classes[t.cls.value]["queued"] += 1
                classes[t.cls.value]["queued_tokens"] += t.tokens
        return {"tenants": tenants, "classes": classes, "running": self._running,
                "queued": self._total_requests, "queued_tokens": self._total_tokens,
                "throughput_cost_per_s": self._thr_ema}
