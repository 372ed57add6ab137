"""Fair sequence slots: admission takes a slot back from a tenant holding more than its share.

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

On an engine that cannot preempt (trtllm), the gate keeps a standing reserve instead (inferd.admission.gate).
"""
from __future__ import annotations

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

    def take_for(self, t: Ticket, cap: Capacity, tenants: TenantRegistry, policy: AdmissionConfig) -> bool:
        """Have a slot yielded for `t` (queued, its tenant owed one) if that is all it lacks; True when the
        engine granted it (capacity() then shows the slot free, for `t` as a light tenant's)."""
        if not (policy.fairness_preemption and self.engine.yields_slots and policy.scheduling != "fcfs"):
            return False
        gate = self._gate
        if gate.fits(cap, t, True, policy) or not gate.within_kv_cap(t, tenants):
            return False
        # The slot is all it lacks: with one more free it would start (as a light tenant's request).
        more = msgspec.structs.replace(cap, free_slots=cap.free_slots + 1)
        if not gate.fits(more, t, True, policy) or not self.owed(t.tenant, tenants):
            return False
        step = self.engine.stats().steps_total
        if step == self._last_step:
            return False
        # The newest that the engine still runs (one that ended may not have told admission yet).
        victim = next((v for v in self.victims(t.tenant, tenants) if self.engine.yield_slot(v.request.request_id)),
                      None)
        if victim is None:
            return False
        self._last_step = step
        gate.parked(victim)
        self.count += 1
        return True
