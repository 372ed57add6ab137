"""The request path, written once: each endpoint's stages in the order a request meets them.

A stage is `async (RequestContext) -> response | None`: it fills its part of the context, refuses with
an ApiError, or answers the request itself (the rest are skipped). Whatever happens, `settle` is the
way out. Stages that do not suspend run back to back without yielding the event loop, so routing's
decision and the hold on the routed version stay one step, as a retire needs.

The stage names are the pipeline's marks on the request's Timeline: `admission` is where the `api`
part of Server-Timing ends and the fair queue's wait begins.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from inferd import __version__
from inferd.api import appkeys as keys
from inferd.api.errors import CLIENT_GONE, ApiError
from inferd.api.pipeline import admission, embedding, front, generation, respond, responses
from inferd.api.pipeline.context import RequestContext
from inferd.api.pipeline.settle import settle
from inferd.api.pipeline.timeline import ADMISSION, Timeline
from inferd.api.pipeline.tracking import begin_tracking
from inferd.api.wire.responses import ChunkEncoder, new_identity
from inferd.models import VersionLease

Stage = Callable[[RequestContext], Awaitable[web.StreamResponse | None]]

GENERATION: Sequence[tuple[str, Stage]] = (
    ("draining", front.refuse_while_draining),
    ("store", front.refuse_while_store_fails),
    ("auth", front.authenticate_caller),
    ("pacing", front.pace_refused_tenant),
    ("body", front.read_request_body),
    ("decode", generation.decode_body),
    ("deadline", front.set_deadline),
    ("idempotency", front.claim_idempotency_key),
    ("cold_start", front.start_cold_model),
    ("route", front.route),
    ("breaker", front.check_circuit_breaker),
    ("degrade", front.degrade_under_overload),
    ("hold", front.hold_version),
    ("permission", front.check_permission),
    ("task", generation.check_generative),
    ("health", front.check_engine_healthy),
    ("length", generation.check_length_bound_of_prompts),
    ("tokenize", generation.tokenize_and_resolve_sampling),
    ("grammar", generation.compile_grammar),
    ("policy", generation.check_content_policy),
    ("track", begin_tracking),
    ("identity", admission.name_the_response),
    ("quota", admission.charge_quota),
    ("cache", admission.look_up_cache),
    ("spill", admission.spill_to_peer),
    (ADMISSION, admission.wait_for_admission),
    ("stream", respond.send_output),
)


def variant(stages: Sequence[tuple[str, Stage]], *, replace: dict[str, Stage],
            insert_after: dict[str, tuple[str, Stage]]) -> tuple[tuple[str, Stage], ...]:
    """`stages` with some stages swapped for an endpoint's own and some added after named ones."""
    out: list[tuple[str, Stage]] = []
    for name, stage in stages:
        out.append((name, replace.get(name, stage)))
        if name in insert_after:
            out.append(insert_after[name])
    return tuple(out)


# POST /v1/responses: chat's stages, with its own decode (instructions, input); the stored conversation of
# previous_response_id is read once the request has its deadline and its idempotency key (a replay reads nothing).
RESPONSES = variant(GENERATION, replace={"decode": responses.decode_request},
                    insert_after={"idempotency": ("conversation", responses.load_conversation)})

EMBEDDING: Sequence[tuple[str, Stage]] = (
    ("draining", front.refuse_while_draining),
    ("store", front.refuse_while_store_fails),
    ("auth", front.authenticate_caller),
    ("pacing", front.pace_refused_tenant),
    ("body", front.read_request_body),
    ("decode", embedding.decode_inputs),
    ("deadline", front.set_deadline),
    ("idempotency", front.claim_idempotency_key),
    ("cold_start", front.start_cold_model),
    ("route", front.route),
    ("breaker", front.check_circuit_breaker),
    ("hold", front.hold_version),
    ("permission", front.check_permission),
    ("task", embedding.check_embedding_model),
    ("health", front.check_engine_healthy),
    ("dimensions", embedding.check_dimensions_asked),
    ("tenant_queue", embedding.precheck_tenant_queue),
    ("tokenize", embedding.tokenize_inputs),
    ("limits", embedding.check_tenant_limits),
    ("policy", embedding.check_content_policy),
    ("track", begin_tracking),
    (ADMISSION, embedding.embed),
)


class Pipeline:
    """One endpoint's stages, run in order over a fresh RequestContext, then settled."""

    def __init__(self, kind: str, stages: Sequence[tuple[str, Stage]]) -> None:
        self.kind = kind
        self.stages = tuple(stages)

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        state = request.app[keys.STATE]
        ctx = RequestContext(request=request, state=state, kind=self.kind, timeline=Timeline(request[keys.ARRIVAL]),
                             version_lease=VersionLease(state.versions))
        response: web.StreamResponse | None = None
        error: BaseException | None = None
        settled = False
        try:
            response = await self._run(ctx)
            return response
        except ApiError as err:
            error = err
            if not ctx.headers_out:
                raise
            # Refused after its SSE headers went out: its end is recorded before the stream's last bytes.
            settled = True
            await settle(ctx, _status(ctx, None, err), err, None)
            return await _end_stream_with(ctx, err)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if not settled:
                await settle(ctx, _status(ctx, response, error), error, response)

    async def _run(self, ctx: RequestContext) -> web.StreamResponse:
        for name, stage in self.stages:
            if name == ADMISSION:       # where `api` ends and the fair queue's wait begins
                ctx.timeline.mark(name)
            response = await stage(ctx)
            if response is not None:
                return response
        raise RuntimeError(f"the {self.kind} pipeline ended without a response")


def _status(ctx: RequestContext, response: web.StreamResponse | None, error: BaseException | None) -> int:
    """The status the request ended with, as the client saw it (499: it left first)."""
    if ctx.client_gone:
        return CLIENT_GONE
    if isinstance(error, ApiError):
        return error.status
    if isinstance(error, (asyncio.CancelledError, ConnectionError)):
        return ctx.status if ctx.status is not None else CLIENT_GONE
    if error is not None:
        return 500                      # a bug: the middleware answers 500
    return ctx.status if ctx.status is not None else response.status


async def _end_stream_with(ctx: RequestContext, err: ApiError) -> web.StreamResponse:
    """A stream refused after its SSE headers went out (while its model loaded or it waited in
    admission): an `error` frame, then `[DONE]`."""
    waiting = ctx.queued if ctx.queued is not None else ctx.early
    ident = ctx.extras.get("ident")
    if ident is None:       # refused before it was named: the model it asked for
        ident = new_identity(ctx.kind, ctx.wire.model, f"inferd-{__version__}")
    output = ctx.extras.get("output")
    encoder = (ChunkEncoder(ident, ctx.prepared.include_usage) if output is None else
               output.encoder(ident, False, None))
    return await waiting.end_with(err, encoder)


_COMPLETION, _CHAT, _EMBEDDING = Pipeline("completion", GENERATION), Pipeline("chat", GENERATION), \
    Pipeline("embedding", EMBEDDING)
_RESPONSES = Pipeline("responses", RESPONSES)


async def create_completion(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _COMPLETION(request)


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _CHAT(request)


async def create_response(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses."""
    return await _RESPONSES(request)


async def create_embedding(request: web.Request) -> web.StreamResponse:
    """POST /v1/embeddings."""
    return await _EMBEDDING(request)
