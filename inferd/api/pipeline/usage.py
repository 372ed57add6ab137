"""The usage ledger's row for each request that reached admission, recorded before its response ends.

The pipeline records each row once (settle.record_usage_once): for a JSON response (or an error)
before the response is returned, for a stream just before its `[DONE]` (inferd.api.streaming.sse
`before_done`), so a response the client received completely is in the ledger (inferd.store.ledger) even if the
daemon is killed right after. What a row bills is what the client received (inferd.api.pipeline.billing).
Requests a peer serves for us (spillover) are recorded by that peer, once.
"""
from __future__ import annotations

import asyncio
import functools
import time

from inferd.api.appkeys import CACHE_HIT
from inferd.api.auth import PRINCIPAL
from inferd.api.errors import store_unavailable
from inferd.api.pipeline.billing import billed_usage
from inferd.api.pipeline.context import RequestContext
from inferd.api.state import ServerState
from inferd.config import price_for
from inferd.observability import SYSTEM_ACTOR, get_logger
from inferd.store import LedgerRow, StoreError
from inferd.types import Delta, EngineTiming

log = get_logger("inferd.api")


def ledger_row(ctx: RequestContext, status: int, last: Delta | None, delivered: int, now: float) -> LedgerRow:
    """The row for `ctx`, which ended with `status`: the tokens billing.billed_usage bills (what its client
    received; `delivered`: the output tokens it got), its final delta's timing when it has one."""
    state, usage = ctx.state, billed_usage(ctx, status, last, delivered)
    version = ctx.engine.info.version
    price = price_for(state.config.prices, ctx.route.target)
    cost = 0.0 if price is None else price.cost(usage.prompt_tokens, usage.completion_tokens)
    if ctx.request.get(CACHE_HIT) and not state.config.cache.bill_hits:
        cost = 0.0                          # a response cache hit, billed as [cache] bill_hits says
    principal = ctx.request.get(PRINCIPAL)
    queue_s, prefill_s, decode_s = _phases(ctx.arrival, last.timing if last is not None else None)
    return LedgerRow(
        request_id=ctx.request_id, tenant=ctx.tenant, key_id=principal.key_id if principal is not None else None,
        model=ctx.model, version=version, node=state.node_name,
        endpoint=ctx.endpoint.ledger_name if ctx.batch_id is None else f"batch:{ctx.endpoint.ledger_name}",
        stream=ctx.prepared.stream, prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens, completion_tokens=usage.completion_tokens, status=status,
        finish_reason=last.finish_reason.value if last is not None and last.finish_reason is not None else None,
        queue_s=queue_s, prefill_s=prefill_s, decode_s=decode_s, total_s=max(0.0, now - ctx.arrival), cost=cost,
        finished_at=time.time())


def _phases(arrival: float, timing: EngineTiming | None) -> tuple[float | None, float | None, float | None]:
    if timing is None or timing.first_scheduled is None:
        return None, None, None
    queue = max(0.0, timing.first_scheduled - arrival)
    if timing.first_token is None:
        return queue, None, None
    prefill = max(0.0, timing.first_token - timing.first_scheduled)
    decode = max(0.0, timing.finished - timing.first_token) if timing.finished is not None else None
    return queue, prefill, decode


def check_ledger(state: ServerState) -> None:
    """503 store_unavailable before anything is read while the ledger is failing (Ledger.unavailable_for):
    a request that could not be billed is not run."""
    ledger = state.ledger
    if ledger is not None and (wait := ledger.unavailable_for()) > 0:
        raise store_unavailable(wait)


async def record_usage(ctx: RequestContext, status: int, last: Delta | None, delivered: int, *,
                       withhold: bool = False) -> None:
    """Record `ctx`'s row and wait until it is committed. A store that fails (disk full) is logged and
    counted, and what was committed before stays. `withhold`: the row is of a response about to be
    acknowledged (a JSON body, a stream's `[DONE]`); then the failure raises 503 store_unavailable
    instead, so no response completes unrecorded (the promise in docs/store.md)."""
    state = ctx.state
    ledger = state.ledger
    if ledger is None:
        return
    row = ledger_row(ctx, status, last, delivered, time.monotonic())
    committed = ledger.enqueue(row)
    # Its spend counts once it commits, whether or not this handler still waits for it: a client leaving now
    # cancels the handler, not the commit, and the tokens its row bills count against the tenant's budget all
    # the same. Added first, the callback runs before the handler resumes (and before a stream's [DONE]).
    committed.add_done_callback(functools.partial(_count_spend, state, ctx.tenant, ctx.model, row))
    try:
        # Shielded: a client leaving at this moment cancels the handler, not the commit (nor the row's future,
        # whose outcome the shield then reads, so a failed commit nobody waits for logs nothing).
        await asyncio.shield(committed)
    except StoreError as exc:
        state.metrics.count_ledger_error()
        log.error("ledger_write_failed", error=str(exc), tenant=ctx.tenant, model=ctx.model,
                  message="this request's usage row is not recorded" + ("; its response is withheld" * withhold))
        if withhold:
            raise store_unavailable(ledger.unavailable_retry_s) from None


def _count_spend(state: ServerState, tenant: str, model: str, row: LedgerRow, committed: asyncio.Future) -> None:
    """A committed row's cost, in the spend metric and the tenant's budget (a warning once it crosses the
    tenant's threshold); nothing for a row that was not committed."""
    if committed.cancelled() or committed.exception() is not None:
        return
    if row.cost:
        state.metrics.count_spend(state.tenancy.tenants.label(tenant), model, row.version, row.cost)
    warning = state.tenancy.budgets.add(tenant, row.cost, row.prompt_tokens + row.completion_tokens)
    if warning is not None:
        log.warning("budget_warning", tenant=tenant, message=warning)
        state.control.audit.append(SYSTEM_ACTOR, "tenant.budget_warning", target=tenant,
                                   reason="budget_warn_fraction", detail={"message": warning})
