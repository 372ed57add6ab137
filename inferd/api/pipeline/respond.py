"""The last stage of a generation: the engine's output to the client, as SSE frames or one JSON body.

From here the engine is generating for this request: every way out cancels its stream (the
`finally`), or a failure before streaming would leave it generating unread until max_tokens. What the
request's end records (ledger row, metrics, rollouts, cache, transcript, trace, log) is `settle`'s.
"""
from __future__ import annotations


import time
from collections.abc import Callable

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.pipeline import idempotency
from inferd.api.streaming.choices import Choices, ChoicesSender, merged_final
from inferd.api.errors import CLIENT_GONE, ApiError
from inferd.api.pipeline.context import RequestContext
from inferd.api.pipeline.settle import record_usage_once
from inferd.api.wire.responses import (
    OPENAI_FINISH,
    ChunkEncoder,
    Identity,
    RunningUsage,
    abnormal_end,
    completion_body,
)
from inferd.api.pipeline.safety import filter_output
from inferd.api.wire.logprobs import LogprobChunkEncoder, LogprobFormat, LogprobStream
from inferd.api.wire.tool_calls import ToolCallParser, parser_for
from inferd.api.wire.tool_stream import ToolChunkEncoder, finish_with_calls, tool_message
from inferd.api.streaming.sse import Sender, stream_response
from inferd.api.pipeline.handoff import handoff_sender
from inferd.api.pipeline.transcripts import retention_s
from inferd.api.pipeline.versioned import mirror_to_shadow
from inferd.cache import RecordingStream
from inferd.types import Delta, FinishReason, Usage


async def send_output(ctx: RequestContext) -> web.StreamResponse:
    state, request = ctx.state, ctx.request
    admitted = ctx.extras["admitted"]
    streams = filter_output(state, ctx.policy, admitted.streams, ctx.tenant, ctx.prompt_ids, ctx.request_id,
                            ctx.model)
    retention = ctx.extras["retention_s"] = retention_s(ctx)     # seconds its text may be kept (0: none)
    if (ctx.cache_plan is not None and ctx.cache_hit is None) or (retention and len(streams) == 1):
        ctx.recording = RecordingStream(streams[0])     # its text as the client got it: cache, transcript
        streams = [ctx.recording]
    formats = ctx.extras["logprobs"] = _logprob_formats(ctx, len(streams))
    if formats:
        streams = [LogprobStream(s, f) for s, f in zip(streams, formats)]
    stream = ctx.delivered = streams[0] if len(streams) == 1 else Choices(streams, ctx.choices_per_prompt)
    inflight = request.app[keys.INFLIGHT]
    entry = None
    try:
        ctx.headers.update(admitted.headers)    # X-RateLimit-*
        if ctx.cache_hit is None:
            mirror_to_shadow(state, ctx.route, ctx.engine, ctx.prompt_ids[0], ctx.sampling[0], ctx.tenant)
        # Admission aborts at the deadline (the stream ends with finish_reason DEADLINE); the watchdog's
        # timeout is the same instant, as a backstop.
        entry = inflight.add(request, stream, max(0.001, ctx.deadline - time.monotonic()), ctx.request_id)
        ident: Identity = ctx.extras["ident"]
        ctx.log_fields.update(model=ctx.model, version=ctx.headers["X-Inferd-Model-Version"], completion_id=ident.id,
                              stream=ctx.prepared.stream)
        if ctx.route.lora is not None:
            ctx.log_fields["lora"] = ctx.route.lora
        return await (_stream(ctx, stream, entry) if ctx.prepared.stream else _collect(ctx, stream, entry))
    except ApiError as err:             # an abnormal end: the client gets its status, so do metrics and rollouts
        if ctx.last is not None:
            ctx.log_fields["finish_reason"] = ctx.last.finish_reason.value
        await record_usage_once(ctx, ctx.last, err.status)
        raise
    finally:
        stream.cancel()                 # no-op when finished; aborts the engine request otherwise
        if entry is not None:
            inflight.discard(entry)
            ctx.streamed = ctx.streamed or ctx.prepared.stream
            ctx.client_gone = entry.client_gone


def _logprob_formats(ctx: RequestContext, count: int) -> list[LogprobFormat] | None:
    """Each choice's logprobs/echo formatter, for requests that asked for either (None: the plain path)."""
    p = ctx.prepared
    if p.logprobs is None and not p.echo:
        return None
    tokenizer = ctx.engine.tokenizer
    prompts = p.prompts()

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    def echo_text(i: int) -> str | None:
        if not p.echo:
            return None
        given = prompts[i // ctx.choices_per_prompt].prompt_text    # n choices per prompt, prompt-major
        return given if given is not None else tokenizer.decode(ctx.prompt_ids[i])

    vocab_entry = getattr(tokenizer, "id_to_token", None)       # the sim's tokenizer has no vocabulary list
    return [LogprobFormat(p.kind, p.logprobs, decode, echo_text=echo_text(i), prompt_ids=ctx.prompt_ids[i],
                          vocab_entry=vocab_entry) for i in range(count)]


async def _stream(ctx: RequestContext, stream, entry) -> web.StreamResponse:
    p, state = ctx.prepared, ctx.state
    running = RunningUsage(ctx.prompt_tokens) if p.continuous_usage else None
    formats, output = ctx.extras.get("logprobs"), ctx.extras.get("output")
    tools = _tool_parsers(ctx)
    if output is not None:          # another wire format's events (the Responses API's)
        encoder = output.encoder(ctx.extras["ident"], state.ledger is not None, ctx.timeline,
                                 tools() if tools is not None else None)
    elif tools is not None:
        encoder = ToolChunkEncoder(tools, ctx.extras["ident"], p.include_usage, formats=formats, running=running,
                                   usage_comment=ctx.forwarded, hold_done=state.ledger is not None,
                                   timeline=ctx.timeline)
    elif formats is None:
        encoder = ChunkEncoder(ctx.extras["ident"], p.include_usage, running=running, usage_comment=ctx.forwarded,
                               hold_done=state.ledger is not None, timeline=ctx.timeline)
    else:
        encoder = LogprobChunkEncoder(formats, ctx.extras["ident"], p.include_usage, running=running,
                                      usage_comment=ctx.forwarded, hold_done=state.ledger is not None,
                                      timeline=ctx.timeline)
    withheld: list[ApiError] = []       # a stream's end refused for want of its ledger row
    ctx.status = CLIENT_GONE            # until the stream ends: what a client that left gets recorded as
    ctx.delivered = entry.accepted      # a stream that does not complete bills what its client's socket took

    async def before_done() -> None:
        # Complete only once its content reached the client (499 if it leaves first, or does not take it
        # within the bound: it is billed what did); then the stream's outcome, even if its client hangs up
        # during the commit.
        status = final_status(entry.final, entry)
        # Only a stream that completes waits for its content to be acknowledged: one that ends in error (its
        # deadline passed, the engine failed) ends so at once, billed what its socket took by then
        if status == 200:
            await _delivered_or_cut(ctx, entry)
        else:
            entry.accepted.sample()     # what its client acknowledged up to now (no sample is taken per frame)
        ctx.status = status
        try:
            await _keep_then_record(ctx, output, encoder.response if output is not None else None, entry.final)
        except ApiError as err:         # the stream ends with this error frame instead of [DONE]
            withheld.append(err)
            raise

    capture = ctx.request.get(idempotency.CAPTURE)
    sender_class = ChoicesSender if isinstance(stream, Choices) else (not capture and handoff_sender(ctx, encoder)) or Sender
    resp = await stream_response(ctx.request, stream, entry, encoder, ctx.headers, p.include_usage, ctx.obs,
                                 ctx.request.app[keys.INFLIGHT], sender_class,
                                 prepared=ctx.queued.prepared if ctx.queued is not None else None,
                                 before_done=before_done if encoder.hold_done else None,
                                 tee=capture.add if capture else None)
    ctx.last = entry.final
    if entry.client_gone:
        ctx.status = CLIENT_GONE        # it left before its final frames were written
    elif ctx.last is not None:
        ctx.status = final_status(ctx.last, entry)
        ctx.log_fields["finish_reason"] = ctx.last.finish_reason.value
    if withheld:
        ctx.status = withheld[0].status
    elif entry.failed:
        ctx.status = 500                # a bug ended the stream with an internal_error frame
    entry.accepted.sample()             # billed as of now, not of the last scan (a row recorded already keeps its own)
    await record_usage_once(ctx, ctx.last, ctx.status)
    return resp


async def _delivered_or_cut(ctx: RequestContext, entry) -> None:
    """Wait (at most [server] stream_ack_timeout_s, and never past the request's deadline) for the client to
    acknowledge the content before the final frames. A client that does not has its connection cut (what
    waits in the buffers would otherwise be kept for it without end), and ConnectionResetError makes the
    stream 499, billed what it acknowledged, as a client that left."""
    bound = min(ctx.state.config.server.stream_ack_timeout_s, ctx.deadline - time.monotonic())
    # Its sender asks whoever writes the socket: this process, or the writer process it was handed to.
    if await entry.sender.acknowledged(bound):
        return
    ctx.log_fields["client_stalled"] = True
    transport = ctx.request.transport
    if transport is not None:
        transport.abort()
    raise ConnectionResetError("the client did not acknowledge its stream's content in time")


async def _collect(ctx: RequestContext, stream, entry) -> web.Response:
    finals = await stream.collect() if isinstance(stream, Choices) else [await stream.collect()]
    ctx.last = finals[0] if len(finals) == 1 else merged_final(finals, ctx.choices_per_prompt)
    resp = _json_response(ctx, finals, entry.timed_out)
    ctx.status = final_status(ctx.last, entry)
    ctx.log_fields["finish_reason"] = ctx.last.finish_reason.value
    output = ctx.extras.get("output")
    await _keep_then_record(ctx, output, output.response if output is not None else None, ctx.last)
    return resp


async def _keep_then_record(ctx: RequestContext, output, response: dict | None, final: Delta | None) -> None:
    """A Responses API response is stored (kept before its client has the end: it can be continued at once),
    then the ledger row is written: a store that fails makes it a 503 (the caller records that status), so the
    ledger never bills as answered what the client got as failed; a ledger that fails unstores it."""
    if output is not None:
        await output.keep(ctx, response)
    try:
        await record_usage_once(ctx, final, ctx.status, withhold=True)
    except ApiError:
        if output is not None:
            await output.forget(ctx, response)
        raise


def _tool_parsers(ctx: RequestContext) -> Callable[[], ToolCallParser] | None:
    """A maker of each choice's tool-call parser (None: no tools in play): the model's own format comes from its
    artifact's manifest (EngineInfo.tool_call_format)."""
    p = ctx.prepared
    if p.kind == "completion" or p.tool_choice == "none" or not p.tools:     # completions have no tools
        return None
    fmt = ctx.engine.info.tool_call_format

    def make() -> ToolCallParser:
        return parser_for(p, fmt)
    return make


def _parser(ctx: RequestContext) -> ToolCallParser | None:
    make = _tool_parsers(ctx)
    return make() if make is not None else None


def final_status(last: Delta, entry) -> int:
    """The status a finished generation answers with: 200, or its abnormal end's (504 past the deadline)."""
    if entry.timed_out:
        return 504
    return 200 if OPENAI_FINISH.get(last.finish_reason) else abnormal_end(last.finish_reason, last.error).status


def _json_response(ctx: RequestContext, finals: list[Delta], timed_out: bool) -> web.Response:
    """The whole response from each choice's final (merged) delta; any abnormal end is the response's error."""
    choices = []
    formats, output = ctx.extras.get("logprobs"), ctx.extras.get("output")
    tools = _tool_parsers(ctx) if output is None else None      # the Responses API parses its own
    calls: list[list[dict] | None] = []
    for i, last in enumerate(finals):
        finish = OPENAI_FINISH.get(last.finish_reason)
        if finish is None:
            raise abnormal_end(FinishReason.DEADLINE if timed_out else last.finish_reason, last.error)
        text = last.text if formats is None else formats[i].text(last.text)
        if tools is not None:
            parser = tools()
            text, made = tool_message(parser, text)
            finish = finish_with_calls(finish, parser)
            calls.append(made)
        choices.append((text, finish))
    usage = ctx.last.usage or Usage(prompt_tokens=0, completion_tokens=sum(len(last.token_ids) for last in finals))
    ctx.headers["Server-Timing"] = ctx.timeline.server_timing(finals[0].timing, time.monotonic())
    logprobs = None if formats is None else [f.take(always=True) for f in formats]
    if output is not None:          # the Responses API's object: its items from the same parser
        return web.Response(body=output.body(ctx.extras["ident"], *choices[0], usage, _parser(ctx)),
                            headers=ctx.headers, content_type="application/json")
    return web.Response(body=completion_body(ctx.extras["ident"], choices, usage, logprobs, calls or None),
                        headers=ctx.headers, content_type="application/json")
