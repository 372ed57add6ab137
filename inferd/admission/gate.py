"""The capacity gate in front of an engine: may this request be released to it now?

A request goes only when the engine has a free slot, KV blocks for the prompt plus a reserve, its own
waiting queue is below a small bound, and the prompt tokens it has not computed yet (queued or
part-prefilled) plus this prompt fit the prefill budget (a longer prompt goes when nothing is pending,
so nothing starves): whatever reaches the engine is, by construction, the fair next request.

Why the prefill budget: the engine is FCFS inside and packs prefill chunks into steps of up to
max_num_tokens. Without the bound, a flooding tenant's prefills fill every step, and a light tenant's
prefill, even when released first, queues behind them and shares steps several times longer than a
decode step. With it, a light tenant's prompt joins at most a budget's worth of pending prefill and is
computed in the engine's next step, one carrying little more than its own prefill.

Light tenants: one with fewer requests queued + running than its weighted share of the engine's slots
(among the tenants with work in flight) is owed service. Its prompt may join pending prefill up to a
whole step (max_num_tokens), and it needs no KV reserve. While a light tenant has arrived recently
beside backlogged ones, heavier tenants leave the last `headroom_fraction` of slots free, so a
well-behaved tenant next to a flooding one starts at once instead of waiting for a slot to free. With
only heavy tenants around, no headroom is held and the engine is filled completely. A generating
engine that cannot preempt (Engine.yields_slots False: trtllm) keeps the headroom as a standing reserve
(`headroom_without_preemption`): heavy tenants and a tenant alone leave it free at all times, as nothing
could free a slot for a tenant arriving later; a light tenant beside others may take it. Not on a node
where only one tenant can send requests (TenantRegistry.shared False: auth mode "none"): no one else
would ever take it.

Parked sequences (preempted for another tenant: inferd.admission.slots) wait for slots and KV blocks the
engine reports free: only a light tenant may use them, so a heavy one's further requests do not take back
the slot its own sequence yielded.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping

from inferd.admission.ticket import Ticket
from inferd.config import AdmissionConfig, TenantRegistry
from inferd.engine import Capacity, Engine


class CapacityGate:
    """What admission has released to one engine and not yet seen end, and the release rule.
    Reads the queue's per-tenant FIFOs (`queues`, never replaced). Loop-thread only."""

    def __init__(self, engine: Engine, queues: Mapping[str, deque[Ticket]], clock: Callable[[], float]) -> None:
        self.engine = engine
        self._queues = queues
        self._clock = clock
        self.running = 0
        self._in_flight: dict[str, int] = {}          # running requests per tenant
        self._kv_in_flight: dict[str, int] = {}       # their prompt + max_tokens
        self.tickets: dict[str, dict[int, Ticket]] = {}  # running requests per tenant, in dispatch order
        self._parked: dict[str, int] = {}             # of them, parked (yielded their slot, not resumed)
        self.last_light = -math.inf                   # a light tenant arrived beside backlogged ones

    def started(self, t: Ticket) -> None:
        self.running += 1
        self._in_flight[t.tenant] = self._in_flight.get(t.tenant, 0) + 1
        self._kv_in_flight[t.tenant] = self._kv_in_flight.get(t.tenant, 0) + t.tokens
        self.tickets.setdefault(t.tenant, {})[t.seq] = t

    def ended(self, t: Ticket) -> None:
        self.running -= 1
        self._in_flight[t.tenant] -= 1
        self._kv_in_flight[t.tenant] -= t.tokens
        running = self.tickets[t.tenant]
        running.pop(t.seq, None)
        if not running:
            del self.tickets[t.tenant]
        self.resumed(t)

    def parked(self, t: Ticket) -> None:
        """`t`'s sequence yielded its slot (Engine.yield_slot)."""
        t.parked = True
        self._parked[t.tenant] = self._parked.get(t.tenant, 0) + 1

    def resumed(self, t: Ticket) -> None:
        """`t` holds a slot again (its stream delivers), or ended."""
        if t.parked:
            t.parked = False
            self._parked[t.tenant] -= 1

    def held(self, tenant: str) -> int:
        """Slots `tenant`'s running requests hold (parked ones hold none)."""
        return self._in_flight.get(tenant, 0) - self._parked.get(tenant, 0)

    def _active(self, tenant: str) -> set[str]:
        active = {n for n, q in self._queues.items() if q} | {n for n, c in self._in_flight.items() if c}
        active.add(tenant)
        return active

    def _fraction(self, tenant: str, tenants: TenantRegistry) -> float:
        """`tenant`'s weight over the weights of the tenants with work in flight or queued (itself included)."""
        return tenants.get(tenant).weight / sum(tenants.get(n).weight for n in self._active(tenant))

    def share(self, tenant: str, tenants: TenantRegistry) -> float:
        """`tenant`'s weighted share of the engine's slots, among the tenants with work in flight or
        queued (itself included)."""
        return self._fraction(tenant, tenants) * self.engine.info.max_batch_size

    def kv_share(self, tenant: str, tenants: TenantRegistry) -> float:
        """The same for the engine's KV blocks."""
        return self._fraction(tenant, tenants) * self.engine.info.num_kv_blocks

    def kv_blocks(self, t: Ticket) -> int:
        """KV blocks running `t` holds, as admission can tell: its prompt and the output delivered so far
        (the engine may have made more; a parked one holds none)."""
        return 0 if t.parked else math.ceil((t.prompt + t.output) / self.engine.info.block_size)

    def kv_held(self, tenant: str) -> int:
        return sum(self.kv_blocks(t) for t in self.tickets.get(tenant, {}).values())

    def is_light(self, tenant: str, tenants: TenantRegistry) -> bool:
        """Fewer requests queued + running than its weighted share of the engine's slots."""
        return len(self._queues.get(tenant, ())) + self._in_flight.get(tenant, 0) < self.share(tenant, tenants)

    def within_kv_cap(self, t: Ticket, tenants: TenantRegistry) -> bool:
        """The tenant's max_kv_tokens_in_flight leaves room for `t` (its first request always goes)."""
        cap = tenants.get(t.tenant).max_kv_tokens_in_flight
        used = self._kv_in_flight.get(t.tenant, 0)
        return cap is None or used == 0 or used + t.tokens <= cap

    def prefill_budget(self, policy: AdmissionConfig) -> int:
        budget = policy.max_pending_prefill_tokens
        return budget if budget is not None else max(1, self.engine.info.max_num_tokens // 4)

    def fits(self, cap: Capacity, t: Ticket, light: bool, policy: AdmissionConfig, tenants: TenantRegistry) -> bool:
        """The engine has room for `t` now (`light`: its tenant is light). `tenants`: the registry now (a
        reload swaps it)."""
        need = math.ceil(t.prompt / cap.block_size)
        slots, blocks = cap.free_slots, cap.free_kv_blocks
        if not light:           # what parked sequences wait for is theirs
            slots, blocks = slots - cap.parked, blocks - cap.parked_kv_blocks
        if slots < 1 or cap.waiting >= policy.max_engine_waiting:
            return False
        info = self.engine.info
        # The prefill budget is headroom too: a light tenant's prompt may join what is pending up to a
        # step's worth of tokens, so it is computed in the engine's next step instead of after it.
        budget = self.prefill_budget(policy)
        limit = max(budget, info.max_num_tokens) if light else budget
        if cap.pending_prefill_tokens and cap.pending_prefill_tokens + t.prompt > limit:
            return False
        # Generation only: an embedding engine's requests hold their slot for one batch, not a stream. And
        # only where another tenant could come: on a node whose every request is one tenant's, nobody would.
        standing = (policy.headroom_without_preemption and not self.engine.yields_slots
                    and info.task == "generate" and tenants.shared)
        alone = standing and light and self._active(t.tenant) == {t.tenant}
        if light and not alone:
            return blocks >= need
        headroom = 0
        if standing or self._clock() - self.last_light < policy.headroom_window_s:
            headroom = int(policy.headroom_fraction * info.max_batch_size)   # < all slots
        if alone:               # light, but the reserve is for whoever comes next
            return slots > headroom and blocks >= need
        reserve = math.ceil(policy.kv_reserve_fraction * info.num_kv_blocks)
        return slots > headroom and blocks >= min(need + reserve, info.num_kv_blocks)
