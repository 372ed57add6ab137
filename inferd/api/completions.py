"""POST /v1/completions and /v1/chat/completions: body -> engine request -> JSON or SSE.

The wire format lives in openai.py (requests) and responses.py (bodies, chunks); streaming in
sse.py. This module is the glue: routing a model name to an engine, tokenization (tokenize.py: a
cheap length bound, then a bounded pool when long), length checks against the model's context,
submit, and the end-of-request metrics and log fields. The order of checks is in admit.py.
"""
from __future__ import annotations

import asyncio
import secrets
import time

import msgspec
from aiohttp import web

from inferd import __version__
from inferd.api import appkeys as keys
from inferd.api import idempotency
from inferd.api.admit import (admit, apply_limits, charge, check_model_allowed, pace_refusals, precheck_quota,
                              refused_bytes, request_deadline)
from inferd.api.auth import authenticate
from inferd.api.body import check_json_content_type, read_body
from inferd.api.cached import cache_plan, lookup, replay, store
from inferd.api.choices import Choices, ChoicesSender, merged_final
from inferd.api.cold_start import early_stream, end_early, spill_cold_start, wait_for_model
from inferd.api.context import GenerationContext
from inferd.api.degrade import DEGRADED_HEADER, Degradation, degrade
from inferd.api.errors import CLIENT_GONE, ApiError, invalid, unavailable
from inferd.api.internal import batch_caller
from inferd.api.openai import COMPLETIONS_DEFAULT_MAX_TOKENS, Prepared, decode, prepare
from inferd.api.responses import (OPENAI_FINISH, ChunkEncoder, Identity, RunningUsage, abnormal_end, completion_body,
                                  server_timing, stages)
from inferd.api.safety import check_input, filter_output
from inferd.api.spill import NODE_HEADER, VERSION_HEADER, check_forwarded_body, forwarded_identity, spill, wants_spill
from inferd.api.slo_outcomes import record_slo, record_slo_for
from inferd.api.sse import Sender, stream_response
from inferd.api.state import ServerState
from inferd.api.tokenize import check_length_bound, tokenize
from inferd.api.transcripts import keep as keep_transcript, retention_s
from inferd.api.usage import check_ledger, record_usage
from inferd.api.versioned import (check_breaker, make_room_for_live, mirror_to_shadow, record_outcome,
                                  route_request)
from inferd.api.waiting import QueuedStream
from inferd.cache import RecordingStream
from inferd.cluster import FORWARDED_HEADER
from inferd.config import PriorityClass
from inferd.engine import Engine, EngineUnavailable, InvalidRequest
from inferd.models import VersionLease
from inferd.tenancy import NO_TURN
from inferd.types import Delta, FinishReason, GenerationRequest, SamplingParams, Usage



def version_label(engine: Engine) -> str:
    """The version clients see: sim engines say so in the version itself (`sim-...+simulated`)."""
    info = engine.info
    return f"{info.version}+simulated" if info.simulated else info.version


def _sampling(p: Prepared, prompt_len: int, max_model_len: int) -> SamplingParams:
    field = "prompt" if p.kind == "completion" else "messages"
    if prompt_len == 0:
        raise invalid(f"{field}: tokenizes to nothing.", param=field, code="empty_prompt")
    if prompt_len >= max_model_len:
        raise invalid(f"{field}: {prompt_len} tokens; this model's context is {max_model_len} tokens "
                      f"(prompt + completion).", param=field, code="context_length_exceeded")
    room = max_model_len - prompt_len
    max_tokens = p.max_tokens
    if max_tokens is None:
        max_tokens = min(COMPLETIONS_DEFAULT_MAX_TOKENS, room) if p.kind == "completion" else room
    elif max_tokens > room:
        name = "max_tokens" if p.kind == "completion" else "max_completion_tokens"
        raise invalid(f"{name}: the prompt ({prompt_len} tokens) + {max_tokens} new tokens exceeds this "
                      f"model's context of {max_model_len} tokens; at most {room} are possible.",
                      param=name, code="context_length_exceeded")
    return SamplingParams(max_tokens=max_tokens, temperature=p.temperature, top_p=p.top_p, seed=p.seed,
                          stop=p.stop, ignore_eos=p.ignore_eos)


async def create_completion(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    state = request.app[keys.STATE]
    lease = VersionLease(state.versions)    # keeps the routed version loaded until this request ends
    response = None
    try:
        response = await _generate_routed(request, kind, state, lease)
        return response
    finally:
        lease.release()
        await idempotency.settle(request, state, response)     # keep a 200 for replays, else release the key


async def _generate_routed(request: web.Request, kind: str, state: ServerState,
                           lease: VersionLease) -> web.StreamResponse:
    model, engine, route, tenant = "other", None, None, ""
    turn, body, early, prepared = NO_TURN, b"", None, None
    try:
        if state.draining:
            raise unavailable("The server is draining; retry on another node.", code="draining")
        check_ledger(state)         # 503 while the store is failing: nothing runs that cannot be billed
        tenancy = state.tenancy
        forwarded = FORWARDED_HEADER in request.headers    # a peer spilled it to us (inferd.api.spill)
        batch = batch_caller(request, state.batch_secret)   # a batch line from our own runner
        if forwarded:       # the peer authenticated and charged the caller; it signed who they are
            ident = forwarded_identity(request, state.cluster)
            tenant = ident.tenant
        elif batch is not None:
            tenant = batch[0]
            precheck_quota(tenancy, tenant)
        else:
            tenant = authenticate(request, "inference").tenant   # 401/403 before anything about the body
            precheck_quota(tenancy, tenant)     # 429 over RPM/concurrency before reading, let alone tokenizing
            turn = await pace_refusals(tenancy, tenant, request)    # a tenant sending invalid requests waits
        check_json_content_type(request)
        server = state.config.server
        body = await read_body(request, server.max_body_bytes)
        if forwarded:       # ... for this body only
            check_forwarded_body(state.cluster, ident, body)
        req = decode(kind, body)
        prepared = prepare(kind, req)
        deadline = request_deadline(request, prepared, tenancy, tenant, server, request[keys.ARRIVAL])
        replayed = await idempotency.claim(request, state, tenant, body, deadline)     # Idempotency-Key
        if replayed is not None:
            return replayed
        # A forwarded request is served by the version its origin routed it to.
        pinned = request.headers.get(VERSION_HEADER) if forwarded else None
        # A model that is not loaded (a memory budget: issue 17): a peer that has it serves it, or it loads
        # here first, or 503 with Retry-After.
        if not forwarded and batch is None:
            spilled = await spill_cold_start(state, request, tenant, req.model, prepared, body, deadline)
            if spilled is not None:
                return spilled
        early = early_stream(state, request, request[keys.REQUEST_ID], prepared.stream)
        await wait_for_model(state, pinned or req.model, deadline, early)
        route = route_request(state, pinned or req.model, tenant, req.user, request[keys.REQUEST_ID])
        if not forwarded:     # the origin already applied the breakers and degradation it routed by
            route = check_breaker(state, route, tenant, req.user, request[keys.REQUEST_ID])
            degraded = degrade(state, route, tenant, batch is not None, req.user, request[keys.REQUEST_ID])
            route = degraded.route
        else:
            degraded = Degradation(route)
        model, engine = route.target.model, state.registry.table.engine(route.target)
        lease.hold(route.target)     # same synchronous step as routing: a retire cannot slip between
        allowed = check_model_allowed(tenancy, tenant, req.model, model)
        if engine.info.task != "generate":
            raise invalid(f"model: `{req.model}` is an embedding model; use /v1/embeddings.", param="model",
                          code="model_not_generative")
        if not engine.healthy:
            record_outcome(state, route.target, None, 503, None)      # the version's failure: its breaker counts it
            raise unavailable(f"The engine serving `{model}` is not available right now.", code="engine_unavailable")
        max_model_len = engine.info.max_model_len
        parts = prepared.prompts()              # one per prompt of a completions batch; usually just one
        for part in parts:                      # every part judged from its length before any is tokenized
            await check_length_bound(engine, part, max_model_len, deadline)
        prompt_ids, sampling = [], []
        for part in parts:
            ids = await tokenize(engine, part, len(body), deadline)
            params = _sampling(part, len(ids), max_model_len)
            prompt_ids.append(ids)
            params = apply_limits(tenancy, tenant, allowed, part, len(ids), params, max_model_len)
            if degraded.max_tokens is not None and params.max_tokens > degraded.max_tokens:
                params = msgspec.structs.replace(params, max_tokens=degraded.max_tokens)
            sampling.append(params)
        # The tenant's content policy on the input: after every cheap refusal and the tokenizer's checks.
        policy = await check_input(state, tenant, prepared, engine, model, request[keys.REQUEST_ID], deadline)
    except ApiError as err:
        state.metrics.count_rejected(model, err.status, engine)
        if route is not None:
            record_slo(state, route, tenant, err.status, batch=batch is not None, forwarded=forwarded)
        turn.refused(err.status, refused_bytes(request, err.status, body, state.config.server.max_body_bytes))
        if early is not None and early.prepared is not None:     # its headers went out while its model loaded
            request[keys.LOG_FIELDS]["outcome_status"] = err.status
            return await end_early(early, err, kind, req.model, prepared.include_usage)
        raise
    except (asyncio.CancelledError, ConnectionError):     # its client left before the answer
        turn.refused(CLIENT_GONE, len(body))
        raise
    finally:
        turn.close()
    ctx = GenerationContext(request=request, state=state, tenant=tenant, prepared=prepared, route=route,
                            model=model, engine=engine, prompt_ids=prompt_ids, sampling=sampling, deadline=deadline,
                            body=body, forwarded=forwarded, batch_id=batch[1] if batch is not None else None,
                            degraded=degraded.header, policy=policy, early=early)
    with state.track():
        try:
            return await (_run(ctx) if state.tracing is None else _traced(ctx))     # off: one test, no OpenTelemetry
        except ApiError as err:     # refused (quota, say) after its headers went out while its model loaded
            if early is None or early.prepared is None:
                raise
            request[keys.LOG_FIELDS]["outcome_status"] = err.status
            return await end_early(early, err, kind, req.model, prepared.include_usage)


async def _traced(ctx: GenerationContext) -> web.StreamResponse:
    """_run inside a trace span. _run ends it with the request's stages; a request that leaves early
    (refused by quota or admission, served by a peer, its client gone) ends it here with its status."""
    request, engine = ctx.request, ctx.engine
    trace = request[keys.TRACE] = ctx.state.tracing.begin(
        f"inferd {request.path}", request.headers, ctx.arrival,
        {"inferd.request_id": ctx.request_id, "inferd.model": ctx.model, "inferd.version": version_label(engine),
         "inferd.tenant": ctx.tenant, "http.request.method": request.method, "url.path": request.path})
    status = 500
    try:
        response = await _run(ctx)
        status = response.status
        return response
    except ApiError as err:
        status = err.status
        raise
    except (ConnectionError, asyncio.CancelledError):
        status = CLIENT_GONE
        raise
    finally:
        trace.end(status, {}, {})


async def _run(ctx: GenerationContext) -> web.StreamResponse:
    request, state, engine, route, model = ctx.request, ctx.state, ctx.engine, ctx.route, ctx.model
    p, tenant = ctx.prepared, ctx.tenant
    arrival = ctx.arrival
    cid = ("chatcmpl-" if ctx.kind == "chat" else "cmpl-") + secrets.token_hex(12)
    info = engine.info
    label = version_label(engine)
    served = f"{model}@{label}" if route.lora is None else f"{model}@{label}:{route.lora}"
    ident = Identity(ctx.kind, cid, int(time.time()), served, f"inferd-{__version__}-{info.backend}")
    headers = {"X-Request-Id": ctx.request_id, "X-Inferd-Model-Version": label}
    if info.simulated:
        headers["X-Inferd-Simulated"] = "true"
    if ctx.degraded:
        headers[DEGRADED_HEADER] = ctx.degraded
    if state.cluster is not None:
        headers[NODE_HEADER] = state.cluster.node_id
    obs = state.metrics.start_request(model, arrival, engine)    # the version that serves it
    if "traceparent" in request.headers:        # ties the log line to the caller's trace (W3C trace context)
        request[keys.LOG_FIELDS]["traceparent"] = request.headers["traceparent"][:128]
    trace = request.get(keys.TRACE)         # set by _traced when [tracing] is configured
    gens = []
    for i, (ids, sampling) in enumerate(zip(ctx.prompt_ids, ctx.sampling)):
        make_room_for_live(state, engine, len(ids), sampling)
        gens.append(GenerationRequest(request_id=cid if i == 0 else f"{cid}-{i}", prompt_token_ids=tuple(ids),
                                      sampling=sampling, tenant=tenant, lora=route.lora))
    try:    # counted against the tenant once, on the node that authenticated it
        lease = None if ctx.forwarded else charge(state.tenancy, tenant, gens)
    except ApiError as err:
        obs.finish(err.status)
        record_slo_for(ctx, err.status)
        await record_usage(ctx, err.status, None, 0)
        raise
    plan = cache_plan(ctx)              # the response cache (inferd.api.cached): a hit runs nothing
    hit = lookup(ctx, plan, headers)
    early_out = ctx.early is not None and ctx.early.prepared is not None      # while its model loaded
    if hit is None and lease is not None and not early_out and wants_spill(ctx):   # a peer with room (api.spill)
        try:
            spilled = await spill(ctx, lease, {**lease.headers, "X-Request-Id": ctx.request_id})
        except (asyncio.CancelledError, ConnectionError):     # its client left before a peer answered
            lease.release(None)
            raise
        if spilled is not None:     # the peer that served it judges it against the SLOs
            obs.finish(spilled.status)
            return spilled
    # A stream kept waiting in admission gets its headers and pings meanwhile (inferd.api.waiting).
    queued = ctx.early if ctx.early is not None and ctx.early.prepared is not None else \
        QueuedStream(request, headers, state.config.server.heartbeat_interval_s) if p.stream and hit is None else None
    if hit is not None:
        admitting = replay(ctx, cid, hit, lease)
    else:
        admitting = admit(state.tenancy, tenant, model, engine, gens, ctx.deadline, lease,
                          priority=PriorityClass.BATCH if ctx.batch_id is not None else None)
    try:
        # Quota (429) then the engine's fair admission queue (429/503/504), which submits when it has room.
        admitted = await (queued.wait(admitting) if queued is not None else admitting)
    except (asyncio.CancelledError, ConnectionError):
        obs.finish(CLIENT_GONE)         # the client left while queued; admission dropped the request
        # (no SLO event: nothing is judged of a request its client abandoned)
        await record_usage(ctx, CLIENT_GONE, None, 0)
        raise
    except (ApiError, InvalidRequest, EngineUnavailable) as exc:
        err = _admission_error(exc, model)
        obs.finish(err.status)
        record_slo_for(ctx, err.status, streamed=queued is not None and queued.prepared is not None)
        await record_usage(ctx, err.status, None, 0)
        if isinstance(exc, EngineUnavailable):
            record_outcome(state, route.target, None, 503, None, adapter=route.lora)
        if queued is not None and queued.prepared is not None:      # headers are out: end the stream
            request[keys.LOG_FIELDS]["outcome_status"] = err.status
            return await queued.end_with(err, ChunkEncoder(ident, p.include_usage))
        raise err from None
    streams = filter_output(state, ctx.policy, admitted.streams, tenant, ctx.prompt_ids, ctx.request_id, model)
    recording = None
    retention = retention_s(ctx)            # seconds this request's text may be kept (0: none)
    if (plan is not None and hit is None) or (retention and len(streams) == 1):
        streams = [recording := RecordingStream(streams[0])]   # its text as the client got it: cache, transcript
    stream = streams[0] if len(streams) == 1 else Choices(streams)
    # From here the engine is generating for us: every path out must cancel the stream (the
    # finally), or a failure before streaming would leave it generating unread until max_tokens.
    inflight = request.app[keys.INFLIGHT]
    log_fields = request[keys.LOG_FIELDS]
    status: int = CLIENT_GONE
    last = None
    entry = None
    recorded = False
    withheld: ApiError | None = None        # a stream's end refused for want of its ledger row

    async def record(final: Delta | None, outcome: int, *, withhold: bool = False) -> None:
        """The ledger row, once, committed before the response's last bytes (inferd.api.usage); a
        response that would complete (`withhold`) becomes 503 store_unavailable if its row cannot be."""
        nonlocal recorded
        if not recorded:
            recorded = True
            await record_usage(ctx, outcome, final, stream.delivered_tokens, withhold=withhold)

    try:
        headers.update(admitted.headers)    # X-RateLimit-*
        if hit is None:
            mirror_to_shadow(state, route, engine, ctx.prompt_ids[0], ctx.sampling[0], tenant)
        # Admission aborts at the deadline (the stream ends with finish_reason DEADLINE); the watchdog's
        # timeout is the same instant, as a backstop.
        entry = inflight.add(request, stream, max(0.001, ctx.deadline - time.monotonic()), ctx.request_id)
        log_fields.update(model=model, version=label, completion_id=cid, stream=p.stream)
        if route.lora is not None:
            log_fields["lora"] = route.lora
        if p.stream:
            running = RunningUsage(sum(map(len, ctx.prompt_ids))) if p.continuous_usage else None
            encoder = ChunkEncoder(ident, p.include_usage, running=running, usage_comment=ctx.forwarded,
                                   hold_done=state.ledger is not None, arrival=arrival)
            tracked = entry

            async def before_done() -> None:
                nonlocal status, withheld   # the stream's outcome, even if its client hangs up during the commit
                status = _final_status(tracked.final, tracked)
                try:
                    await record(tracked.final, status, withhold=True)
                except ApiError as err:     # the stream ends with this error frame instead of [DONE]
                    withheld = err
                    raise

            resp = await stream_response(request, stream, entry, encoder, headers, p.include_usage, obs, inflight,
                                         ChoicesSender if isinstance(stream, Choices) else Sender,
                                         prepared=queued.prepared if queued is not None else None,
                                         before_done=before_done if encoder.hold_done else None,
                                         tee=capture.add if (capture := request.get(idempotency.CAPTURE)) else None)
            last = entry.final
        else:
            finals = await stream.collect() if isinstance(stream, Choices) else [await stream.collect()]
            last = finals[0] if len(finals) == 1 else merged_final(finals)
            resp = _json_response(ident, finals, headers, entry.timed_out, arrival)
        if last is not None:
            status = _final_status(last, entry)
            if not p.stream or not entry.client_gone:
                log_fields["finish_reason"] = last.finish_reason.value
        if withheld is not None:
            status = withheld.status
        elif entry.failed:
            status = 500                # a bug ended the stream with an internal_error frame
        await record(last, status, withhold=not p.stream)
        return resp
    except ApiError as err:             # an abnormal end: the client gets err.status, so do metrics and rollouts
        status = err.status
        if last is not None:
            log_fields["finish_reason"] = last.finish_reason.value
        await record(last, status)
        raise
    except ConnectionError:
        raise                           # the client left: CLIENT_GONE
    except Exception:
        status = 500                    # a bug: the middleware answers 500
        raise
    finally:
        stream.cancel()                 # no-op when finished; aborts the engine request otherwise
        if entry is not None:
            inflight.discard(entry)
            if entry.client_gone:
                status = CLIENT_GONE
        usage = last.usage if last is not None else None
        timing = last.timing if last is not None else None
        if not recorded:                # the client left, or a bug: what was delivered is billed
            await record(last, status)
        obs.finish(status, usage=usage, timing=timing)
        if hit is None:                 # a cache hit says nothing about the version (rollouts, breakers)
            record_outcome(state, route.target, last, status, obs.ttft, adapter=route.lora)
        store(ctx, plan, status, recording.whole() if recording is not None else None)    # not a hit's
        keep_transcript(ctx, recording, retention)
        if trace is not None:
            trace.end(status, stages(arrival, timing), {"inferd.completion_tokens": usage.completion_tokens
                                                        if usage is not None else 0})
        headers_out = entry is not None or (queued is not None and queued.prepared is not None)
        record_slo_for(ctx, status, obs=obs, streamed=p.stream and headers_out)
        if usage is not None:
            log_fields.update(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                              cached_tokens=usage.cached_tokens)
        if obs.ttft is not None:
            log_fields["ttft_ms"] = round(obs.ttft * 1000, 3)
        log_fields["outcome_status"] = status


def _final_status(last: Delta, entry) -> int:
    """The status a finished generation answers with: 200, or its abnormal end's (504 past the deadline)."""
    if entry.timed_out:
        return 504
    return 200 if OPENAI_FINISH.get(last.finish_reason) else abnormal_end(last.finish_reason, last.error).status


def _admission_error(exc: Exception, model: str) -> ApiError:
    """What a refusal from quota, admission or the engine's submit says to the client."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InvalidRequest):
        return invalid(str(exc), param=exc.param)
    return unavailable(f"The engine serving `{model}` is unavailable: {exc}", code="engine_unavailable")


def _json_response(ident: Identity, finals: list[Delta], headers: dict[str, str], timed_out: bool,
                   arrival: float) -> web.Response:
    """The whole response from each choice's final (merged) delta; any abnormal end is the response's error."""
    choices = []
    for last in finals:
        finish = OPENAI_FINISH.get(last.finish_reason)
        if finish is None:
            raise abnormal_end(FinishReason.DEADLINE if timed_out else last.finish_reason, last.error)
        choices.append((last.text, finish))
    usage = (finals[0].usage if len(finals) == 1 else merged_final(finals).usage) or Usage(
        prompt_tokens=0, completion_tokens=sum(len(last.token_ids) for last in finals))
    headers["Server-Timing"] = server_timing(arrival, finals[0].timing, time.monotonic())
    return web.Response(body=completion_body(ident, choices, usage), headers=headers,
                        content_type="application/json")
