"""The request path's side of the response cache (inferd.cache): which requests may use it, under what key.

A request is cacheable when its tenant opted in (`cache_responses = true`), it has one choice (one
prompt and `n` = 1: a list of prompts or `n` > 1 makes several), and
its output is determined by its input: greedy (temperature 0) or seeded. The key is the tenant
(never shared across tenants), the exact model version and adapter that would serve it, the prompt's
token ids and every sampling parameter. `Cache-Control: no-cache` skips the lookup (the fresh answer
is still stored); `no-store` keeps the request out of the cache entirely.
"""
from __future__ import annotations

import hashlib
from collections.abc import Hashable

import msgspec

from inferd.admission import Lease
from inferd.api import appkeys as keys
from inferd.api.pipeline.admit import Admitted
from inferd.api.pipeline.context import RequestContext
from inferd.api.pipeline.versioned import adapter_info
from inferd.cache import ReplayStream
from inferd.types import Delta, FinishReason

CACHE_HEADER = "X-Inferd-Cache"      # hit | miss | refresh (no-cache): on cacheable requests only


class CachePlan(msgspec.Struct, frozen=True):
    key: Hashable
    read: bool                       # look it up (false under Cache-Control: no-cache)


def cache_plan(ctx: RequestContext) -> CachePlan | None:
    """How `ctx` uses the cache, or None when it does not."""
    state = ctx.state
    cache = state.response_cache
    if cache is None or not cache.max_bytes or ctx.forwarded or len(ctx.prompt_ids) != 1:
        return None
    if not state.tenancy.tenants.get(ctx.tenant).cache_responses:
        return None
    sampling = ctx.sampling[0]
    if sampling.temperature != 0 and sampling.seed is None:
        return None
    control = ctx.request.headers.get("Cache-Control", "").lower()
    if "no-store" in control:
        return None
    # A digest, not the prompt itself: the cache's byte bound must bound its memory, keys included.
    adapter = None
    if ctx.route.lora is not None:          # its files' version: new files after a reload are another adapter
        info = adapter_info(ctx.state, ctx.model, ctx.engine, ctx.route.lora)
        adapter = (info.version or info.source) if info is not None else ctx.route.lora
    digest = hashlib.blake2b(msgspec.msgpack.encode([str(ctx.route.target), ctx.route.lora, adapter,
                                                     ctx.prompt_ids[0], sampling]), digest_size=32).digest()
    return CachePlan((ctx.tenant, digest), "no-cache" not in control)


def is_cache_hit(ctx: RequestContext) -> bool:
    return bool(ctx.request.get(keys.CACHE_HIT))


def lookup(ctx: RequestContext, plan: CachePlan | None, headers: dict[str, str]) -> Delta | None:
    """The stored generation for `plan`, counted and labelled (`X-Inferd-Cache`); None on a miss."""
    if plan is None:
        return None
    metrics = ctx.state.metrics
    if not plan.read:
        headers[CACHE_HEADER] = "refresh"
        metrics.count_cache_lookup("refresh")
        return None
    hit = ctx.state.response_cache.get(plan.key)
    headers[CACHE_HEADER] = "hit" if hit is not None else "miss"
    metrics.count_cache_lookup("hit" if hit is not None else "miss")
    return hit


async def replay(ctx: RequestContext, completion_id: str, hit: Delta, lease: Lease | None) -> Admitted:
    """A hit, as admission would hand over a request: nothing runs, so the quota lease settles now."""
    ctx.request[keys.CACHE_HIT] = True
    if lease is not None:
        lease.release(hit.usage)
    return Admitted(streams=[ReplayStream(completion_id, hit)], headers=lease.headers if lease is not None else {})


def store(ctx: RequestContext, plan: CachePlan | None, status: int, whole: Delta | None) -> None:
    """Keep a finished generation (stop or length, answered 200) for the next identical request."""
    if plan is None or status != 200 or whole is None or is_cache_hit(ctx):
        return
    if whole.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
        ctx.state.response_cache.put(plan.key, whole)
