"""Quota, refusal pacing, deadline and the fair admission queue for one request: the checks the
pipeline's stages (inferd.api.pipeline.run) call, in the order that module lists them. Everything here
runs once per request; nothing per token.

Errors leave as ApiError in the OpenAI envelope: 400/403 for tenant limits (retrying cannot help),
429 for quota and the tenant's own queue, 503 for the node's queue, 504 for a deadline that passed
while queued. Every 429/503 carries a Retry-After computed from bucket or queue state.
"""
from __future__ import annotations

import asyncio
import math

import msgspec
from aiohttp import web

from inferd.admission import AdmissionQueue, AdmissionRejected, AdmittedStream, Lease, retry_after_header
from inferd.api.auth import model_forbidden
from inferd.api.errors import TIMEOUT, UNAVAILABLE, ApiError, invalid
from inferd.api.wire.openai import Prepared
from inferd.config import PriorityClass, ServerConfig
from inferd.engine import Engine
from inferd.tenancy import BudgetExceeded, Paced, QuotaExceeded, Tenancy, Turn
from inferd.types import GenerationRequest, Usage

RATE_LIMIT = "rate_limit_error"
TIMEOUT_HEADER = "X-Request-Timeout"


def precheck_quota(tenancy: Tenancy, tenant: str) -> None:
    """429 now if `admit` would refuse this tenant whatever the request (requests per minute,
    concurrency, a spent budget): before its body is read or tokenized. Charges nothing; `admit` charges."""
    try:
        tenancy.budgets.check(tenant)
    except BudgetExceeded as exc:
        tenancy.count_rejection(tenant, "budget_exceeded")
        raise ApiError(429, _message(exc), type=RATE_LIMIT, code="budget_exceeded",
                       headers={"Retry-After": retry_after_header(exc.retry_after_s)}) from None
    try:
        tenancy.quota.precheck(tenant)
    except QuotaExceeded as exc:
        raise quota_error(exc) from None


async def pace_refusals(tenancy: Tenancy, tenant: str, request: web.BaseRequest) -> Turn:
    """Before the body is read: a tenant over its refused-bytes burst waits for its turn (a timer, no CPU),
    or gets 429 `refusals_paced` when that is further than a request may wait. The caller reports a
    refusal to the returned Turn and closes it when the request has passed or failed its checks."""
    try:
        turn, wait_s = tenancy.refusals.enter(tenant, request.content_length, tenancy.config.server.max_body_bytes)
    except Paced as exc:
        tenancy.count_rejection(tenant, "refusals_paced")
        raise ApiError(429, str(exc), type=RATE_LIMIT, code="refusals_paced",
                       headers={"Retry-After": retry_after_header(exc.retry_after_s)}) from None
    if wait_s > 0:
        try:
            await asyncio.sleep(wait_s)
        except BaseException:           # the client left while waiting: its reservation goes back
            turn.close()
            raise
        turn.waited()
    return turn


def refused_bytes(request: web.BaseRequest, status: int, body: bytes, limit: int) -> int:
    """What a refused request cost the node in body bytes: what was read; else, refused before its body
    was read (which aiohttp then reads and drops), its Content-Length up to the limit, and for a 413 of a
    body without one, the limit it went past."""
    if body:
        return len(body)
    length = request.content_length
    if length is None:
        return limit if status == 413 else 0
    return min(length, limit)


def quota_error(exc: QuotaExceeded) -> ApiError:
    headers = {**exc.headers, "Retry-After": retry_after_header(exc.retry_after_s)}
    return ApiError(429, f"{exc}.", type=RATE_LIMIT, code=exc.reason, headers=headers)


def check_model_allowed(tenancy: Tenancy, tenant: str, requested: str, model: str) -> str:
    """403 unless the tenant may use `model` (the served name) or the name it asked for (an alias).
    Returns the allowed name, for quota.check_limits. Checked before tokenizing: cheap refusals first."""
    cfg = tenancy.tenants.get(tenant)
    if cfg.allows_model(model):
        return model
    name = requested.partition(":")[0].partition("@")[0]      # an adapter rides on its base model's permission
    if cfg.allows_model(name):
        return name
    tenancy.count_rejection(tenant, "model_not_allowed")
    raise model_forbidden(tenant, requested)


def request_deadline(request: web.BaseRequest, p: Prepared, tenancy: Tenancy, tenant: str, server: ServerConfig,
                     arrival: float) -> float:
    """Absolute (time.monotonic) deadline: arrival + the smallest of the client's X-Request-Timeout
    header or body `timeout`, the tenant's max_request_timeout_s and the server's request_timeout_s."""
    budget = min(server.request_timeout_s, tenancy.tenants.get(tenant).max_request_timeout_s)
    header = request.headers.get(TIMEOUT_HEADER)
    if header is not None:
        try:
            client = float(header)
        except ValueError:
            client = math.nan
        if not (client > 0 and math.isfinite(client)):
            raise invalid(f"{TIMEOUT_HEADER}: expected a positive number of seconds, got {header[:40]!r}.",
                          param=TIMEOUT_HEADER, code="invalid_timeout")
        budget = min(budget, client)
    body = getattr(p, "timeout", None)
    if body is not None:
        budget = min(budget, body)
    return arrival + budget


class Admitted(msgspec.Struct, kw_only=True):
    streams: list[AdmittedStream]    # one per prompt (choice), in order
    headers: dict[str, str]          # X-RateLimit-* after this request was charged


class SharedLease:
    """One quota lease held by the engine requests of one HTTP request (a list of prompts, `n` choices of
    each): each request releases its share, and the lease goes back, with their usage summed, when the
    last does. A prompt's tokens count once however many choices it has (`choices_per_prompt`, the
    requests in prompt-major order), as they are charged, billed and reported."""

    def __init__(self, lease: Lease, n: int, choices_per_prompt: int = 1) -> None:
        self._lease = lease
        self._pending = n
        self._usages: list[Usage] = []
        self.shares = [_LeaseShare(self, i % choices_per_prompt == 0) for i in range(n)]

    def _release(self, usage: Usage | None) -> None:
        if usage is not None:
            self._usages.append(usage)
        self._pending -= 1
        if self._pending == 0:
            self._lease.release(Usage.summed(self._usages))


class _LeaseShare:
    __slots__ = ("_shared", "_released", "_counts_prompt")

    def __init__(self, shared: SharedLease, counts_prompt: bool) -> None:
        self._shared = shared
        self._released = False
        self._counts_prompt = counts_prompt     # the first choice of its prompt: it carries the prompt's tokens

    def release(self, usage: Usage | None) -> None:
        if not self._released:           # idempotent, as Lease.release
            self._released = True
            if usage is not None and not self._counts_prompt:
                usage = msgspec.structs.replace(usage, prompt_tokens=0, cached_tokens=0)
            self._shared._release(usage)


def charge(tenancy: Tenancy, tenant: str, gens: list[GenerationRequest], choices_per_prompt: int = 1) -> Lease:
    """Charge the tenant's quota once for all of `gens` (one per choice, prompt-major, `choices_per_prompt`
    of each prompt, whose tokens count once): 429 when it has no room."""
    try:
        prompt_tokens = sum(len(g.prompt_token_ids) for g in gens[::choices_per_prompt])
        return tenancy.quota.acquire(tenant, prompt_tokens=prompt_tokens,
                                     max_tokens=sum(g.sampling.max_tokens for g in gens))
    except QuotaExceeded as exc:
        raise quota_error(exc) from None


async def admit(tenancy: Tenancy, tenant: str, model: str, engine: Engine, gens: list[GenerationRequest],
                deadline: float, lease: Lease | None, *, priority: PriorityClass | None = None,
                choices_per_prompt: int = 1) -> Admitted:
    """Wait in the engine's admission queue until each of `gens` is released to it; all are admitted
    or none is. `lease` is the quota `charge` took (None: charged elsewhere, by the peer that
    forwarded the request). `priority`: a class other than the tenant's (batch lines: `batch`).
    `choices_per_prompt`: `gens` are n choices of each prompt, prompt-major (SharedLease).

    The lease travels with the requests: admission releases it when a request is refused, leaves the
    queue, or ends (refunding the tokens it did not use). Raises ApiError (429/503/504), or the
    engine's InvalidRequest / EngineUnavailable from its submit."""
    try:
        queue = tenancy.queue_for(model, engine)
    except AdmissionRejected as exc:      # closed: the daemon is draining
        if lease is not None:
            lease.release(None)
        raise rejection_error(exc, {}) from None
    try:
        if len(gens) == 1:
            streams = [await queue.admit(gens[0], deadline=deadline, lease=lease, priority=priority)]
        else:
            shares = (SharedLease(lease, len(gens), choices_per_prompt).shares if lease is not None
                      else [None] * len(gens))
            streams = await _admit_all(queue, gens, deadline, shares, priority)
    except AdmissionRejected as exc:
        raise rejection_error(exc, tenancy.quota.headers(tenant) if lease is not None else {}) from None
    return Admitted(streams=streams, headers=lease.headers if lease is not None else {})


async def _admit_all(queue: AdmissionQueue, gens: list[GenerationRequest], deadline: float,
                     shares: list[_LeaseShare] | list[None], priority: PriorityClass | None) -> list[AdmittedStream]:
    """Each request waits in the queue on its own (fairness sees n requests); the first refusal or a
    cancelled caller withdraws the rest and cancels those already admitted."""
    tasks = [asyncio.ensure_future(queue.admit(g, deadline=deadline, lease=s, priority=priority))
             for g, s in zip(gens, shares)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            if not task.done():
                task.cancel()
            elif not task.cancelled() and task.exception() is None:
                task.result().cancel()
        raise


def rejection_error(exc: AdmissionRejected, ratelimit_headers: dict[str, str]) -> ApiError:
    headers = dict(ratelimit_headers) if exc.status == 429 else {}
    retry = exc.retry_after_header
    if retry is not None:
        headers["Retry-After"] = retry
    kind = RATE_LIMIT if exc.status == 429 else TIMEOUT if exc.status == 504 else UNAVAILABLE
    return ApiError(exc.status, _message(exc), type=kind, code=exc.reason, headers=headers)


def _message(exc: Exception) -> str:
    """The refusal's text as a sentence: capitalised, with its full stop."""
    text = str(exc)
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else text + "."
