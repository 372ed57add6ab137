"""At start, before the listener serves: release what a crashed daemon on this node still held.

A daemon killed mid-request (kill -9, OOM, power) leaves its Idempotency-Key claims 'running' until
their hold lapses (the request's deadline plus a margin: minutes), so every retry meanwhile is a 409;
and it leaves its batch lease until the lease expires (30 s), so the batch waits. Claims and leases
name their holder's process (inferd.store.owner: node, pid, start), so the next daemon on the node
releases those of its predecessors that no longer run, and a retry or the batch runs at once. Other
nodes' rows are left alone: their process may be alive, and if not, their hold or lease lapses.
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from inferd.daemon.context import DaemonContext
from inferd.observability import get_logger
from inferd.store import BatchStore, StoreError

log = get_logger("inferd.daemon")


async def release_dead_claims(ctx: DaemonContext) -> tuple[int, int]:
    """(Idempotency-Key claims, batch leases) released; (0, 0) without a store or when it fails (the
    rows then lapse at their hold or lease, as they would have)."""
    storage, state = ctx.storage, ctx.state
    if storage is None or state is None:
        return 0, 0
    node = state.node_name
    try:
        claims = await storage.idempotency.release_dead(node)
        leases = await BatchStore(storage.database).release_dead(node)
    except StoreError as exc:
        log.warning("release_dead_claims_failed", node=node, error=str(exc))
        return 0, 0
    if claims or leases:
        log.info("released_dead_claims", node=node, idempotency_claims=claims, batch_leases=leases)
    return claims, leases


@contextlib.asynccontextmanager
async def dead_claims(ctx: DaemonContext) -> AsyncIterator[None]:
    """The service (inferd.daemon.services): after the cluster has its node id, before the site serves."""
    await release_dead_claims(ctx)
    yield
