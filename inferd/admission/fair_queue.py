"""The per-engine admission queue: weighted-fair order, deadlines, bounds, and a capacity-gated dispatcher.

One FIFO per tenant. The next request released is picked by priority class and, within a class, by the
weighted virtual token counter (inferd.admission.vtc); light tenants (under their weighted share of the engine's
slots) go first within their class. A request is released only when the engine has room for it
(inferd.admission.gate), so whatever reaches the engine is the fair next request; its stream then
charges the output it delivers and enforces the deadline (inferd.admission.stream). Waits,
Retry-After and early refusals come from inferd.admission.estimate.

The dispatcher is a task woken by submissions, first tokens and finishing streams, plus a short poll
while blocked on engine capacity (capacity also frees on engine steps). When the picked request cannot
go yet (no slot beyond the headroom, no room in the prefill budget) a light tenant's request that fits
goes instead; and when a tenant owed a slot waits while another holds more than its share of the slots
(or of the KV blocks), the engine is asked to yield one of the over-served tenant's sequences
(inferd.admission.slots).
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import msgspec

from inferd.admission.backlog import Backlog
from inferd.admission.estimate import MIN_RETRY_S, Estimator
from inferd.admission.gate import CapacityGate
from inferd.admission.slots import SlotYields
from inferd.admission.stats import AdmissionStats
from inferd.admission.stream import AdmittedStream
from inferd.admission.ticket import DISPATCHED, DONE, QUEUED, AdmissionRejected, Lease, Ticket
from inferd.admission.vtc import FairOrder
from inferd.config import AdmissionConfig, PriorityClass, TenantRegistry
from inferd.engine import Engine, InvalidRequest
from inferd.types import GenerationRequest, Usage

Clock = Callable[[], float]

__all__ = ["AdmissionQueue", "AdmissionRejected", "AdmittedStream", "QueueLoad"]


UNKNOWN_WAIT_S = 3600.0     # QueueLoad.wait_s when work would wait and no service rate is known yet


class QueueLoad(msgspec.Struct, frozen=True):
    queued: tuple[int, ...]      # requests waiting, per priority class (interactive, standard, batch)
    wait_s: float                # a newcomer's estimated wait (0: it would start now)
    cost_per_s: float            # measured service rate (0: not measured yet)
    full: bool                   # at the node's queue bounds: a newcomer of the lowest class is refused


class AdmissionQueue:
    """Admission for one engine. Loop-thread only; `start()` inside the running loop."""

    def __init__(self, engine: Engine, policy: AdmissionConfig, tenants: TenantRegistry, *,
                 clock: Clock = time.monotonic, time_scale: float = 1.0) -> None:
        """`clock` gives deadlines' time base. `time_scale` = loop seconds per clock second: 1 for a real
        engine; a sim engine's time_scale when `clock` runs in simulated time (benchmarks)."""
        self.engine = engine
        self.policy = policy
        self.tenants = tenants
        self._clock = clock
        self._time_scale = time_scale
        self._backlog = Backlog()
        self._seq = 0
        self._order = FairOrder()
        self.counters = self._order.counters          # VTC, per tenant
        self._gate = CapacityGate(engine, self._backlog.fifos, clock)
        self._slots = SlotYields(engine, self._gate)
        self._estimate = Estimator(engine, clock)
        self._stats = AdmissionStats()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="admission-dispatcher")

    async def close(self) -> None:
        """Stop dispatching; every queued request gets 503 `draining`. Running streams are untouched."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for q in list(self._backlog.fifos.values()):
            for t in list(q):
                self._reject_queued(t, AdmissionRejected.draining())

    def set_tenants(self, tenants: TenantRegistry) -> None:
        self.tenants = tenants

    # -- the caller's side ----------------------------------------------------------------
    async def admit(self, request: GenerationRequest, *, deadline: float, priority: PriorityClass | None = None,
                    lease: Lease | None = None) -> AdmittedStream:
        """Wait until `request` is released to the engine; returns its stream. `deadline` is absolute on
        this queue's clock. Raises AdmissionRejected, or the engine's InvalidRequest / EngineUnavailable.
        `lease` (from Quota.acquire) is released when the request ends or is refused. Cancelling the
        caller removes the request from the queue (or aborts it if it was just released)."""
        return await self.admitted(self.enter(request, deadline=deadline, priority=priority, lease=lease))

    def enter(self, request: GenerationRequest, *, deadline: float, priority: PriorityClass | None = None,
              lease: Lease | None = None, hold: int = 0, rest_cost: float = 0.0, follow_up: bool = False,
              from_hold: bool = False) -> Ticket:
        """`admit`'s synchronous half: refuse `request` (raises, releasing `lease`), queue it, or release it
        to the engine at once. A ticket entered must be awaited with `admitted` or given back with `withdraw`.

        A request of several parts (an embeddings request's inputs) enters its first part with `hold`:
        the places its other parts will take at most at once, held now and judged with it against the
        queue bounds, and `rest_cost`, their cost, judged with it by the early refusal. So it is refused
        whole, up front, before anything is computed. Its other parts then enter as `follow_up`s, taking a
        held place while the caller has one (`from_hold`); they are not judged again, and are never shed
        for higher classes: a request let in is never refused partway for room (deadlines and TTLs still
        apply). The caller gives back the places it did not take with `release_hold`."""
        try:
            t = self._enter(request, deadline, priority, lease, hold, rest_cost, follow_up)
            if follow_up and from_hold:
                self._backlog.hold(t.tenant, -1)
            elif hold:
                self._backlog.hold(t.tenant, hold)
            t.grouped = follow_up or hold > 0
            if t.future is None:        # released at once: nothing queued, engine has room
                t.stream = self._submit(t)
        except BaseException:
            if lease is not None:
                lease.release(None)
            raise
        return t

    def cost_of(self, requests) -> float:
        """What `requests` would cost in the fair order (for `enter`'s `rest_cost`)."""
        return sum(self._estimate.cost(r, self.policy) for r in requests)

    def release_hold(self, tenant: str, n: int) -> None:
        """Give back `n` places `enter(hold=...)` held that no follow-up took."""
        if n > 0:
            self._backlog.hold(tenant, -n)
            self._wake.set()

    async def admitted(self, t: Ticket) -> AdmittedStream:
        """`admit`'s waiting half: the stream of a ticket `enter` returned, once it is released."""
        if t.future is None:
            return t.stream
        try:
            return await t.future
        except asyncio.CancelledError:
            self.withdraw(t)
            raise

    def withdraw(self, t: Ticket) -> None:
        """The caller gives `t` up: out of the queue if still queued, its stream cancelled if released.
        Idempotent."""
        if t.state == QUEUED:
            self._remove(t)
            self._settle(t, None)
            if t.future is not None and not t.future.done():
                t.future.cancel()
        elif t.stream is not None:
            t.stream.cancel()
        elif t.future is not None and t.future.done() and not t.future.cancelled() and t.future.exception() is None:
            t.future.result().cancel()

    def precheck(self, tenant: str, hold: int = 0) -> None:
        """Raise 429 queue_full now if `tenant`'s queue has no room for a request that will `hold` places
        beside its own (what `enter` will judge): for a caller about to do expensive work (tokenizing
        many inputs) before it enters."""
        backlog = self._backlog
        q = backlog.fifos.get(tenant)
        held = backlog.held.get(tenant, 0)
        if self._tenant_full(tenant, 1 + hold, 1):
            self._stats.rejected(self.tenants.label(tenant), "queue_full")
            raise AdmissionRejected(f"tenant {tenant!r} has too many requests queued", status=429,
                                    reason="queue_full", retry_after_s=self._estimate.retry_after(
                                        self._estimate.queued_wait(backlog.cost.get(tenant, 0.0)),
                                        1 / max(1, len(q or ()) + held)))

    def _tenant_full(self, tenant: str, places: int, tokens: int) -> bool:
        """`tenant`'s queue (with the places it holds) has no room for `places` more requests of `tokens`
        tokens in all. A tenant with nothing queued or held always has room: its first request goes."""
        backlog, cfg = self._backlog, self.tenants.get(tenant)
        queued = len(backlog.fifos.get(tenant) or ()) + backlog.held.get(tenant, 0)
        return queued > 0 and (queued + places > cfg.max_queued_requests
                               or backlog.tokens.get(tenant, 0) + tokens > cfg.max_queued_tokens)

    def _enter(self, request: GenerationRequest, deadline: float, priority: PriorityClass | None,
               lease: Lease | None, hold: int = 0, rest_cost: float = 0.0, follow_up: bool = False) -> Ticket:
        if self._closing:
            raise AdmissionRejected.draining()
        now = self._clock()
        cfg = self.tenants.get(request.tenant)
        cls = priority or cfg.priority
        self._seq += 1
        t = Ticket(request, cls, self._estimate.cost(request, self.policy), deadline,
                   min(deadline, now + self.policy.ttl_s(cls)), now, self._seq, lease)
        if math.ceil(t.prompt / self.engine.info.block_size) > self.engine.info.num_kv_blocks:
            raise InvalidRequest(f"prompt of {t.prompt} tokens needs more KV blocks than the engine has",
                                 param="messages")
        if deadline <= now:
            self._reject(t, "deadline", 504, None, "the request's deadline passed before it could start")
        backlog = self._backlog
        q = backlog.fifos.get(t.tenant)
        held = backlog.held.get(t.tenant, 0)
        if not follow_up and self._tenant_full(t.tenant, 1 + hold, t.tokens * (1 + hold)):
            queued_tokens = backlog.tokens.get(t.tenant, 0)
            overflow = max(1 / max(1, len(q or ()) + held), (queued_tokens + t.tokens - cfg.max_queued_tokens)
                           / max(1, queued_tokens))
            wait, _ = self._wait(t, own_only=True)
            self._reject(t, "queue_full", 429, self._estimate.retry_after(wait, overflow),
                         f"tenant {t.tenant!r} has too many requests queued")
        light = self._gate.is_light(t.tenant, self.tenants)
        if backlog.requests and light:
            self._gate.last_light = now      # a light tenant arrived while others are backlogged: keep headroom
        if (not q and backlog.requests == 0 and self._gate.within_kv_cap(t, self.tenants)
                and self._gate.fits(self.engine.capacity(), t, light, self.policy, self.tenants)):
            self._lift(t.tenant)
            return t
        # Only a measured capacity refuses early: the engine's own tokens/s, which stands in until then, is
        # what it ran at, not what it can run (a GPU decodes ~85x more tokens/s at batch 256 than at 1).
        if self.policy.early_refusal and not follow_up and self._estimate.measured_rate:
            wait, own = self._wait(t)
            wait += self._estimate.queued_wait(rest_cost)       # the request's other parts after it
            budget = (t.expires - now) * self.policy.early_refusal_fraction
            if wait > budget:
                reason = "deadline" if t.deadline <= t.expires else "ttl"
                self._reject(t, reason, 429 if own >= wait / 2 else 503, wait - budget,
                             f"estimated queue wait {wait:.2f}s exceeds the request's {budget:.2f}s budget")
        if not follow_up and (backlog.requests + backlog.held_total + hold >= self.policy.max_queued_requests
                              or backlog.total_tokens + t.tokens * (1 + hold) > self.policy.max_queued_tokens):
            self._make_room(t, hold)
        self._enqueue(t)
        return t

    # -- queue state ----------------------------------------------------------------------
    def _enqueue(self, t: Ticket) -> None:
        if not self._backlog.fifos.get(t.tenant):
            self._lift(t.tenant)
        self._backlog.append(t)
        self._order.joined(t.cls)
        loop = asyncio.get_running_loop()
        t.future = loop.create_future()
        t.timer = loop.call_later(max(0.0, t.expires - self._clock()) * self._time_scale, self._expire, t)
        self._wake.set()

    def _remove(self, t: Ticket) -> None:
        self._backlog.remove(t)
        t.state = DONE
        if t.timer is not None:
            t.timer.cancel()
        self._order.left(t.cls)

    def _lift(self, tenant: str) -> None:
        """A tenant that was not backlogged: lifted to the backlogged minimum (no credit banked while idle)."""
        self._order.lift(tenant, self._backlog.backlogged(besides=tenant))

    def _wait(self, t: Ticket, *, own_only: bool = False) -> tuple[float, float]:
        return self._estimate.wait(t, self._backlog, self.tenants, self.policy, own_only=own_only)

    # -- rejections -----------------------------------------------------------------------
    def _reject(self, t: Ticket, reason: str, status: int, retry: float | None, message: str) -> None:
        self._stats.rejected(self.tenants.label(t.tenant), reason)
        raise AdmissionRejected(message, status=status, reason=reason, retry_after_s=retry)

    def _reject_queued(self, t: Ticket, exc: AdmissionRejected) -> None:
        self._remove(t)
        self._stats.rejected(self.tenants.label(t.tenant), exc.reason)
        self._settle(t, None)
        if t.future is not None and not t.future.done():
            t.future.set_exception(exc)

    def _settle(self, t: Ticket, usage: Usage | None) -> None:
        t.state = DONE
        if t.lease is not None:
            t.lease.release(usage)

    def _expire(self, t: Ticket) -> None:
        if t.state != QUEUED:
            return
        if t.deadline <= t.expires:
            exc = AdmissionRejected("the request's deadline passed while it was queued", status=504,
                                    reason="deadline", retry_after_s=self._retry_after_waited(t))
        else:
            exc = AdmissionRejected(f"queued longer than the {t.cls.value} class allows", status=503,
                                    reason="ttl", retry_after_s=self._retry_after_waited(t))
        self._reject_queued(t, exc)

    def _retry_after_waited(self, t: Ticket) -> float:
        """Retry-After for a request dropped after waiting: the estimated rest of its wait; with no
        service rate measured yet, as long as it already waited (the queue held it that long), never
        a constant. asyncio may run the timer a hair before `expires` (within its clock resolution),
        so the wait counts up to the later of now and the expiry."""
        if self._estimate.rate():
            return self._estimate.retry_after(self._wait(t)[0], 0.0)
        return max(MIN_RETRY_S, max(self._clock(), t.expires) - t.arrived)

    def _make_room(self, t: Ticket, hold: int = 0) -> None:
        """Node full: shed queued work of lower classes if that frees enough for `t` and the places it
        holds; else refuse the newcomer (503)."""
        backlog, policy = self._backlog, self.policy
        need_tokens = backlog.total_tokens + t.tokens * (1 + hold) - policy.max_queued_tokens
        need_requests = backlog.requests + backlog.held_total + 1 + hold - policy.max_queued_requests
        victims = backlog.shed_for(t, need_requests, need_tokens, self._order.counter)
        if victims is None:
            overflow = max(1 / max(1, backlog.requests), need_tokens / max(1, backlog.total_tokens))
            rate = self._estimate.rate()
            drain = backlog.total_cost() / rate if rate else 0.0
            self._reject(t, "node_full", 503, self._estimate.retry_after(drain, overflow), "the node's queue is full")
        for v in victims:
            self._reject_queued(v, AdmissionRejected(
                "shed for higher-priority work: the node's queue is full", status=503, reason="node_full",
                retry_after_s=self._estimate.retry_after(self._wait(v)[0], 0.0)))

    # -- dispatch -------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            self._wake.clear()
            blocked = self._dispatch()
            if blocked:
                self._estimate.saturated()
                # Capacity also frees on engine steps, which send no event: a timer wakes the loop too.
                # (A timer rather than asyncio.wait_for: no task per poll, and no swallowed cancel.)
                timer = loop.call_later(self.policy.poll_interval_s, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()
            else:
                await self._wake.wait()

    def _dispatch(self) -> bool:
        """Release requests while the engine has room. True if work is waiting on capacity."""
        gate = self._gate
        while self._backlog.requests:
            t = self._pick()
            if t is None:
                return True
            cap = self.engine.capacity()
            light = gate.is_light(t.tenant, self.tenants)
            if not gate.fits(cap, t, light, self.policy, self.tenants):
                t = self._instead(t, light, cap)
                if t is None:
                    return True
            self._remove(t)
            stream = self._submit(t)
            if stream is not None:
                t.future.set_result(stream)
        return False

    def _instead(self, t: Ticket, light: bool, cap) -> Ticket | None:
        """The picked `t` cannot go now: a light tenant's request that fits instead (the headroom is kept
        for them: no waiting behind t), or one owed a slot that an over-served tenant yielded for it."""
        if self.policy.scheduling == "fcfs":
            return None
        gate, tenants = self._gate, self.tenants
        if not light:
            alt = self._pick(lambda n: gate.is_light(n, tenants))
            if alt is not None and gate.fits(cap, alt, True, self.policy, tenants):
                return alt
        owed = t if self._slots.owed(t.tenant, tenants) else self._pick(lambda n: self._slots.owed(n, tenants))
        freed = self._slots.take_for(owed, cap, tenants, self.policy) if owed is not None else None
        if freed is not None:   # the engine may not count the yielded sequence's blocks free yet
            now = self.engine.capacity()
            blocks = max(now.free_kv_blocks, cap.free_kv_blocks + freed)
            if gate.fits(msgspec.structs.replace(now, free_kv_blocks=blocks), owed, True, self.policy, tenants):
                return owed
        return None

    def _pick(self, only: Callable[[str], bool] | None = None) -> Ticket | None:
        """The next request in the fair order; `only`: among these tenants' queue heads."""
        gate, tenants = self._gate, self.tenants
        heads = []
        fifos = self._backlog.fifos
        for n, q in fifos.items():
            while q and q[0].future is not None and q[0].future.done():   # caller gone: drop at dequeue
                gone = q[0]
                self._remove(gone)
                self._settle(gone, None)
            if q and gate.within_kv_cap(q[0], tenants) and (only is None or only(n)):
                heads.append(q[0])
        if not heads:
            return None
        return self._order.pick(heads, self.policy, lambda n: gate.is_light(n, tenants), lambda n: len(fifos[n]))

    def _submit(self, t: Ticket) -> AdmittedStream | None:
        """Hand `t` to the engine. On an engine error a queued caller gets it through its future
        (and None is returned); a caller released at once gets it raised."""
        request, weight = t.request, self.tenants.get(t.tenant).weight
        if request.weight != weight:        # for the engine's KV preemption (inferd.engine.victims)
            request = msgspec.structs.replace(request, weight=weight)
        try:
            stream = self.engine.submit(request)
        except Exception as exc:
            self._settle(t, None)
            if t.future is not None:
                t.future.set_exception(exc)
                return None
            raise
        now = self._clock()
        t.state = DISPATCHED
        self._gate.started(t)
        self._charge(t, t.prompt * self.policy.prompt_cost_weight)
        self._stats.admitted(self.tenants.label(t.tenant), t.prompt, now - t.arrived)
        deadline_in = (max(0.0, t.deadline - now) * self._time_scale) if t.deadline < math.inf else None
        return AdmittedStream(self, t, stream, now - t.arrived, deadline_in)

    # -- called by running streams (AdmittedStream) ---------------------------------------
    def _charge(self, t: Ticket, cost: float) -> None:
        self._order.charge(t.tenant, t.cls, cost, self.tenants.get(t.tenant).weight)
        self._estimate.served(cost)

    def charge_output(self, t: Ticket, n: int) -> None:
        """`n` more output tokens of `t` were delivered."""
        t.output += n
        self._stats.output(self.tenants.label(t.tenant), n)
        self._charge(t, n * self.policy.output_cost_weight)

    def resumed(self, t: Ticket) -> None:
        """A parked request's stream delivers again: it holds a slot."""
        self._gate.resumed(t)

    def first_token(self, t: Ticket) -> None:
        self._stats.first_token(self.tenants.label(t.tenant), self._clock() - t.arrived)
        self._wake.set()       # its prefill is done: pending prefill went down, the next may fit

    def stream_ended(self, t: Ticket, usage: Usage, complete: bool) -> None:
        """`complete`: it ended with the engine's final usage (not cancelled by its consumer)."""
        self._gate.ended(t)
        if complete:    # a cancelled stream's partial output would bias the expected output length down
            self._estimate.observe_output(usage.completion_tokens)
        self._settle(t, usage)
        self._wake.set()

    # -- observability --------------------------------------------------------------------
    def load(self) -> QueueLoad:
        """This queue's load as peers see it (inferd.cluster's load hints) and spillover judges it."""
        backlog, policy = self._backlog, self.policy
        if not backlog.requests and self.engine.capacity().free_slots > 0:
            wait = 0.0                              # it would start at once
        else:   # behind the queue, plus about one request's worth for a running one to end
            rate = self._estimate.rate()
            ahead = backlog.total_cost() + self._estimate.typical_cost(policy)
            wait = min(ahead / rate, UNKNOWN_WAIT_S) if rate else UNKNOWN_WAIT_S
        full = backlog.requests >= policy.max_queued_requests or backlog.total_tokens >= policy.max_queued_tokens
        return QueueLoad(queued=tuple(backlog.by_class), wait_s=wait * self._time_scale,
                         cost_per_s=self._estimate.rate() or 0.0, full=full)

    def pressure(self) -> tuple[int, float]:
        """(requests queued, seconds the longest-waiting of them has waited): overload degradation's
        signal (inferd.api.pipeline.degrade). Costs one look per tenant with requests queued."""
        heads = [q[0].arrived for q in self._backlog.fifos.values() if q]
        return self._backlog.requests, (self._clock() - min(heads)) * self._time_scale if heads else 0.0

    def snapshot(self) -> dict:
        """Values for the Prometheus series (see docs/tenants.md), keyed by bounded tenant label."""
        return self._stats.snapshot(self._backlog, self.counters, self.tenants.label, self._gate.running,
                                    self._estimate.measured_rate, self._clock())
