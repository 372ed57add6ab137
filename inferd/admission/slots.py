"""Fair sequence slots and KV: admission takes a sequence back from a tenant holding more than its share.

The fair queue orders who gets the next free slot, but a burst of long generations from one tenant can
hold every slot, and nothing would free one for a tenant arriving after it for a whole generation. On
an engine that can preempt (Engine.yields_slots: reference, sim), when a tenant *owed* a slot waits for
one while another holds more than its weighted share of the engine's slots, admission asks the engine
to yield the over-served tenant's newest sequence (Engine.yield_slot): it is preempted, parked, and
recomputed from its tokens so far once a slot is free and nothing newer waits. Nothing is lost; its
stream only pauses. The slot goes to the waiting tenant's request at once.

Owed: the tenant holds no slot, or holds at least one fewer than its share. Victim: a tenant that still
holds at least its share after giving one up; the one most over its share; its newest running
request. So a move never makes the victim owed nor the waiter over-served: slots never go back and
forth. At most one yield per engine step, and none when the waiting request could not start even
with the slot (the prefill budget, KV blocks, the engine's own queue).

KV too: a tenant whose long contexts fill the KV cache holds the blocks, not the slots. When the request
of a tenant owed a slot lacks KV blocks (its tenant, with it, would still hold no more than its weighted
share of the blocks) and another tenant holds more than its share of them even after yielding its
newest, that one yields, the same way, if the request would then fit with that tenant's excess freed.
Admission counts a running request's blocks from its prompt and the output delivered so far (a lower
bound), and the blocks a yield frees as free at once (the reference engine frees them before its next
step). Once the cache is full the engine preempts for blocks from the tenant holding the most per weight
(inferd.engine.victims), so the waiting tenant's sequence keeps them.

On an engine that cannot preempt (trtllm), the gate keeps a standing reserve instead (inferd.admission.gate).
"""
from __future__ import annotations

import math

import msgspec

from inferd.admission.gate import CapacityGate
from inferd.admission.ticket import Ticket
from inferd.config import AdmissionConfig, TenantRegistry
from inferd.engine import Capacity, Engine


class SlotYields:
    """Loop-thread only. `count`: yields the engine granted, since start."""

    def __init__(self, engine: Engine, gate: CapacityGate) -> None:
        self.engine = engine
        self._gate = gate
        self._last_step = -1          # engine step of the last yield
        self.count = 0

    def owed(self, tenant: str, tenants: TenantRegistry) -> bool:
        """`tenant` holds no slot, or at least one fewer than its weighted share."""
        held = self._gate.held(tenant)
        return held == 0 or held + 1 <= self._gate.share(tenant, tenants)

    def victims(self, waiter: str, tenants: TenantRegistry) -> list[Ticket]:
        """The running requests, newest first, of the tenant most over its share that would keep at least
        its share after yielding one slot (never `waiter`, never one at or under its share)."""
        gate, best, best_over = self._gate, None, 0.0
        for tenant, running in gate.tickets.items():
            held = gate.held(tenant)
            if tenant == waiter or held < 1:
                continue
            share = gate.share(tenant, tenants)
            if held - 1 >= share and (best is None or held - share > best_over):
                best, best_over = tenant, held - share
        if best is None:
            return []
        return [t for t in reversed(gate.tickets[best].values()) if not t.parked]

    def kv_victims(self, t: Ticket, cap: Capacity, tenants: TenantRegistry, policy: AdmissionConfig) -> list[Ticket]:
        """For `t`, short of KV blocks only: the running requests, newest first, of the tenant most over its
        weighted share of the KV blocks that keeps at least its share after yielding its newest; none when
        `t`'s tenant would then hold more than its own share, or when `t` would not fit even with that
        tenant's excess freed (a slot more included: a yield frees one)."""
        gate = self._gate
        if gate.kv_held(t.tenant) + math.ceil(t.prompt / cap.block_size) > gate.kv_share(t.tenant, tenants):
            return []
        best, best_over = None, 0.0
        for tenant, running in gate.tickets.items():
            newest = next((v for v in reversed(running.values()) if not v.parked), None)
            if tenant == t.tenant or newest is None:
                continue
            held, share = gate.kv_held(tenant), gate.kv_share(tenant, tenants)
            if held - gate.kv_blocks(newest) >= share and held - share > best_over:
                best, best_over = tenant, held - share
        if best is None:
            return []
        more = msgspec.structs.replace(cap, free_slots=cap.free_slots + 1,
                                       free_kv_blocks=cap.free_kv_blocks + int(best_over))
        if not gate.fits(more, t, True, policy, tenants):
            return []
        return [v for v in reversed(gate.tickets[best].values()) if not v.parked]

    def take_for(self, t: Ticket, cap: Capacity, tenants: TenantRegistry, policy: AdmissionConfig) -> int | None:
        """Have a sequence yielded for `t` (queued, its tenant owed a slot) if a slot, or KV blocks, are all
        it lacks. Returns the KV blocks the yield frees as admission can tell (the engine may count them
        free only after its next step), or None when no sequence was yielded."""
        if not (policy.fairness_preemption and self.engine.yields_slots and policy.scheduling != "fcfs"):
            return None
        gate = self._gate
        if gate.fits(cap, t, True, policy, tenants) or not gate.within_kv_cap(t, tenants):
            return None
        # With one more slot free it would start (as a light tenant's request): the slot is all it lacks.
        more = msgspec.structs.replace(cap, free_slots=cap.free_slots + 1)
        if gate.fits(more, t, True, policy, tenants):
            victims = self.victims(t.tenant, tenants)
        else:           # KV blocks (and perhaps a slot) are what it lacks
            victims = self.kv_victims(t, cap, tenants, policy)
        if not victims:
            return None
        step = self.engine.stats().steps_total
        if step == self._last_step:
            return None
        # The newest that the engine still runs (one that ended may not have told admission yet).
        victim = next((v for v in victims if self.engine.yield_slot(v.request.request_id)), None)
        if victim is None:
            return None
        self._last_step = step
        freed = gate.kv_blocks(victim)
        gate.parked(victim)
        self.count += 1
        return freed
