"""A request for a model that is not loaded (under a memory budget): wait for its load, or 503 with when to retry.

Only with a memory budget (`state.lifecycle`, inferd.models.memory_budget). The request path calls
`wait_for_model` after the cheap refusals and before routing: the prompt is tokenized by the version
that will serve it, so nothing about the prompt can be judged before it is loaded. A streamed request
that waits gets its SSE headers and `: ping` heartbeats meanwhile (inferd.api.streaming.waiting), so a proxy
does not cut it; whatever ends it after that is an `error` frame and `[DONE]` (the pipeline's runner).
"""
from __future__ import annotations

import asyncio
import math

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.pipeline.admit import quota_error
from inferd.api.errors import CLIENT_GONE, INVALID_REQUEST, UNAVAILABLE, ApiError
from inferd.api.wire.openai import Prepared
from inferd.api.pipeline.sampling import charge_estimate
from inferd.api.state import ServerState
from inferd.api.pipeline.spill import Outgoing, forward
from inferd.api.streaming.waiting import QueuedStream
from inferd.models import LifecycleError
from inferd.tenancy import QuotaExceeded


def early_stream(state: ServerState, request: web.BaseRequest, request_id: str, stream: bool) -> QueuedStream | None:
    """The response a streamed request sends early if its model must load first (None: nothing to wait for)."""
    if not stream or state.lifecycle is None:
        return None
    return QueuedStream(request, {"X-Request-Id": request_id}, state.config.server.heartbeat_interval_s)


async def wait_for_model(state: ServerState, model_field: str, deadline: float, early: QueuedStream | None,
                         tenant: str = "", priority: str | None = None) -> None:
    """Return once the version `model_field` asks for is loaded (at once when it is, or when the daemon has
    no budget); else ApiError 503 `model_loading` / `no_room_for_model` / `model_load_failed` /
    `model_does_not_fit` / `model_unloading` / `model_not_configured`, with Retry-After when one is known.
    `tenant` and its `priority` class: the version of an alias's precision tier for them."""
    lifecycle = state.lifecycle
    if lifecycle is None:
        return
    key = lifecycle.key_for(model_field, state.registry.table, tenant, priority)
    if key is None:
        return
    ensuring = lifecycle.ensure(key, deadline)
    try:
        await (early.wait(ensuring) if early is not None else ensuring)
    except LifecycleError as exc:
        raise lifecycle_error(exc, param="model") from None


def lifecycle_error(exc: LifecycleError, param: str | None = None) -> ApiError:
    """The lifecycle's refusal in the OpenAI envelope: 503 (with Retry-After when one is known), or the
    admin's 409."""
    headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))} if exc.retry_after_s else {}
    return ApiError(exc.status, str(exc), type=UNAVAILABLE if exc.status == 503 else INVALID_REQUEST,
                    param=param, code=exc.code, headers=headers)


async def spill_cold_start(state: ServerState, request: web.Request, tenant: str, model_field: str,
                           prepared: Prepared, body: bytes, deadline: float) -> web.StreamResponse | None:
    """In a cluster: a request for a model not loaded here (and not loading) goes to a peer that has it
    loaded, rather than this node evicting and loading (the peer's load hints say which versions it has).
    The tenant is charged here, as for any spill, on an estimate (the prompt's characters, an upper bound
    of its tokens, and its max_tokens): the usage the peer reports settles it, refunding or taking the
    difference. For a `"latest"` default the peer routes it as its own (its default, its rollout
    weights), not to whichever version it happens to have. None: served here (no peer has it, or every
    one failed)."""
    lifecycle, cluster = state.lifecycle, state.cluster
    if lifecycle is None or cluster is None or not cluster.config.spillover or ":" in model_field:
        return None
    key = lifecycle.key_for(model_field, state.registry.table)
    if key is None or lifecycle.loading_here(key):
        return None
    version = None if key[1] == "latest" else key[1]
    if cluster.peer_with_room(key[0], version) is None:
        return None
    max_tokens = charge_estimate(prepared)
    try:
        lease = state.tenancy.quota.acquire(tenant, prompt_tokens=_prompt_bound(prepared), max_tokens=max_tokens)
    except QuotaExceeded as exc:
        raise quota_error(exc) from None
    rid = request[keys.REQUEST_ID]
    obs = state.metrics.start_request(key[0], request[keys.ARRIVAL])
    spilled = None
    try:
        with state.track():         # a drain waits for it like any request in flight
            spilled = await forward(Outgoing(request, tenant, rid, deadline, key[0], version, body), cluster,
                                    lease, {**lease.headers, "X-Request-Id": rid}, "forwarded_cold")
    except (asyncio.CancelledError, ConnectionError):
        obs.finish(CLIENT_GONE)
        raise
    finally:
        if spilled is None:         # no peer took it, or its client left first: nothing was served
            lease.release(None)
    if spilled is not None:         # else it runs here, observed as any request
        obs.finish(spilled.status)
    return spilled


def _prompt_bound(p: Prepared) -> int:
    """At least as many as the prompt's tokens: a token is never less than one character."""
    if p.messages is not None:      # + a few for each message's role markers
        return sum(len(m["content"]) + 8 for m in p.messages)
    return sum(len(part.prompt_token_ids) if part.prompt_token_ids is not None else part.prompt_chars
               for part in p.prompts())
