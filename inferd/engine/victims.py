"""Which running sequence gives its KV blocks up when the pool is short: tenant-aware, newest first.

The scheduler preempts when a running sequence needs a block and none is free. Taking the newest
sequence whatever its tenant lets a tenant whose long contexts fill the pool push a lighter tenant's
short request out again and again (it was admitted last, so it is always the newest): that tenant
starves while the heavy one keeps its blocks. So the victim is the newest sequence of the tenant holding
the most blocks per unit of weight (Sequence.weight, the tenant's configured weight). That tenant holds
at least its weighted share of the blocks the running sequences hold, so a tenant under its share never
loses a sequence while one over its share has one to give. With one tenant (or equal holdings per
weight, where the newest's tenant wins the tie) this is the newest running sequence, as before.
"""
from __future__ import annotations

from inferd.engine.sequence import Sequence


def victim_index(running: list[Sequence]) -> int:
    """Index in `running` (admission order, newest last; not empty) of the sequence to preempt."""
    last = len(running) - 1
    newest_tenant = running[last].tenant
    held: dict[str, int] = {}
    weight: dict[str, float] = {}
    for seq in reversed(running):       # newest first: a tenant's weight is its newest sequence's
        tenant = seq.tenant
        if tenant not in held:
            held[tenant] = 0
            weight[tenant] = seq.weight if seq.weight > 0 else 1.0
        held[tenant] += len(seq.block_table)
    if len(held) == 1:
        return last
    # Ties go to the tenant seen first, newest first: the newest sequence's tenant, as without tenants.
    best = max(held, key=lambda name: held[name] / weight[name])
    if best == newest_tenant:
        return last
    for i in range(last - 1, -1, -1):
        if running[i].tenant == best:
            return i
    return last     # unreachable: best holds a running sequence
