"""The Responses API's own part of the generation pipeline: its decode stage, and its output (the
Response object, its event encoder, and keeping it in the store).

POST /v1/responses runs chat's stages (keys, quotas, fair admission, the ledger, idempotency, SLOs,
safety filters) over a Prepared of kind "responses": instructions as the system message, then the
stored conversation of `previous_response_id`, then `input`. Its own stages: `decode`, and `conversation`
(after `idempotency`: the stored conversation read within the deadline, link by link); the output stage
(inferd.api.pipeline.respond) asks `ctx.extras["output"]` (a ResponsesOutput) for its encoder and body.

Storing follows the tenant's retention (docs/privacy.md): a tenant whose retention is a period has its
responses stored by default, kept for that period; a tenant with retention "none" (or a server with no
store) stores nothing, and `store: true` is a 400 naming `store`. A stored response is committed before
its client gets the last of it (the final event, or the body), so a `previous_response_id` naming it
works at once, and after a restart.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from inferd.api.errors import NOT_FOUND, TIMEOUT, ApiError, invalid, store_unavailable
from inferd.api.pipeline.context import RequestContext
from inferd.api.state import ServerState
from inferd.api.wire.openai import decode_with
from inferd.api.wire.responses import Identity
from inferd.api.wire.responses_events import ResponseEventEncoder
from inferd.api.wire.responses_output import STATUS, echo_of, finished_response, output_items
from inferd.api.wire.responses_items import item_messages, prompt_chars
from inferd.api.wire.responses_request import ResponsesRequest, decoder, prepare
from inferd.api.pipeline.timeline import Timeline
from inferd.store import StoreError, StoredConversation
from inferd.types import Usage

_DECODER = decoder()
# How many stored responses one previous_response_id may walk back through (one store read each).
MAX_CHAIN = 100


def not_found(response_id: str, param: str | None) -> ApiError:
    """Unknown, expired and another tenant's are the same answer: ids cannot be probed across tenants."""
    return ApiError(404, f"Response with id {response_id!r} not found.", type=NOT_FOUND, param=param,
                    code="response_not_found")


async def decode_request(ctx: RequestContext) -> None:
    """The body as a ResponsesRequest (400 naming the field), and whether it is stored. The conversation it
    continues is read later (`load_conversation`), once the request has its deadline and idempotency key."""
    req: ResponsesRequest = decode_with(_DECODER, ctx.body)
    prepared, inputs = prepare(req)
    state = ctx.state
    retention = state.tenancy.tenants.get(ctx.tenant).retention_s if state.storage is not None else 0.0
    if req.store and not retention:
        why = ("its retention keeps no text (retention \"none\")" if state.storage is not None
               else "this server has no durable store")
        raise invalid(f"store: this tenant's responses cannot be stored: {why}; send store: false.",
                      param="store", code="store_not_allowed")
    ctx.wire, ctx.prepared = req, prepared
    stored = retention if req.store is not False else 0.0
    ctx.extras["output"] = ResponsesOutput(req, inputs, stored, keeps_any=retention > 0)


async def load_conversation(ctx: RequestContext) -> None:
    """The stored conversation `previous_response_id` ends, between the instructions and the input (404 naming
    it when it is not this tenant's, or no longer kept), read within the request's deadline: a store that does
    not answer in time is a 504."""
    output: ResponsesOutput = ctx.extras["output"]
    response_id = output.req.previous_response_id
    if response_id is None:
        return
    if not output.keeps_any:
        why = ("this tenant keeps no responses: its retention is none; see docs/privacy.md"
               if ctx.state.storage is not None else "this server has no durable store; see docs/privacy.md")
        raise ApiError(404, f"Response with id {response_id!r} not found: {why}.", type=NOT_FOUND,
                       param="previous_response_id", code="response_not_found")
    try:
        before = await asyncio.wait_for(_conversation(ctx, response_id), max(0.001, ctx.deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise ApiError(504, "The request's deadline passed while its previous_response_id was read from the store.",
                       type=TIMEOUT, param="previous_response_id", code="deadline_exceeded") from None
    prepared = ctx.prepared
    head = prepared.messages[:1] if output.req.instructions else []
    prepared.messages = head + before + prepared.messages[len(head):]
    prepared.prompt_chars = prompt_chars(prepared.messages)


async def _conversation(ctx: RequestContext, response_id: str) -> list[dict]:
    """The chat messages the stored response `response_id` ends with: each stored response keeps only its own
    turn (its input, then its output) and the id it continued, so the conversation is rebuilt by walking those
    links back, at most MAX_CHAIN of them; a link deleted or expired is a 404 naming previous_response_id."""
    turns: list[list[dict]] = []
    link: str | None = response_id
    while link is not None:
        if len(turns) == MAX_CHAIN:
            raise invalid(f"previous_response_id: the conversation it continues is longer than {MAX_CHAIN} "
                          "responses; start a new one with the history in `input`.", param="previous_response_id",
                          code="conversation_too_long")
        found = await find_stored(ctx.state, ctx.tenant, link)
        if found is None and link == response_id:
            raise not_found(response_id, "previous_response_id")
        if found is None:
            raise ApiError(404, f"Response with id {response_id!r} continues {link!r}, which is not found (deleted or "
                           "expired): the conversation cannot be rebuilt.", type=NOT_FOUND,
                           param="previous_response_id", code="response_not_found")
        kept = orjson.loads(found.conversation)
        if isinstance(kept, list):      # written before rows kept only their own turn: the whole conversation
            turns.append(kept)
            break
        turns.append(kept["turn"])
        link = found.previous_response_id
    return [message for turn in reversed(turns) for message in turn]


async def find_stored(state: ServerState, tenant: str, response_id: str) -> StoredConversation | None:
    """`tenant`'s stored response `response_id`, if it is still kept: within the period it was written with,
    and within the tenant's period as configured now (a shortened one, or "none", hides it at once; the next
    purge deletes it). None for another tenant's. A store that fails is a 503."""
    if state.storage is None:
        return None
    now = time.time()
    try:
        found = await state.storage.responses.get(tenant, response_id, now)
    except StoreError:
        raise store_unavailable() from None
    if found is not None and found.created_at <= now - state.tenancy.tenants.get(tenant).retention_s:
        return None
    return found


class ResponsesOutput:
    """What /v1/responses answers with, for the output stage: the encoder of a stream, the body of a
    response that is not one, and the store's copy of either."""

    def __init__(self, req: ResponsesRequest, inputs: list[dict], stored_s: float, *, keeps_any: bool) -> None:
        self.req = req
        self.inputs = inputs                # this request's own input, as chat messages
        self.stored_s = stored_s            # how long it is kept (0: not stored)
        self.keeps_any = keeps_any          # whether this tenant keeps responses at all (retention not "none")
        self.echo = echo_of(req, stored_s > 0)
        self.response: dict | None = None

    def encoder(self, ident: Identity, hold_done: bool, timeline: Timeline | None,
                parser: Any = None) -> ResponseEventEncoder:
        """The stream's encoder; `parser`: the output's tool call parser when tools are in play."""
        return ResponseEventEncoder(ident, self.echo, hold_done=hold_done, timeline=timeline, parser=parser)

    def body(self, ident: Identity, text: str, finish: str, usage: Usage, parser: Any = None) -> bytes:
        pieces = [text] if parser is None else parser.feed(text) + parser.close()
        self.response = finished_response(ident, self.echo, output_items(pieces, STATUS[finish][0]), finish, usage)
        return orjson.dumps(self.response)

    async def keep(self, ctx: RequestContext, response: dict | None) -> None:
        """Store `response` (the whole Response) with its own turn (its input, its output) and the id it
        continues, when it is to be stored: not the conversation before it, so deleting a response removes
        its text from the store, and rows do not grow with the chain. A store that fails is a 503, so the
        client never holds an id that names nothing."""
        if not self.stored_s or response is None or ctx.state.storage is None:
            return
        conversation = {"turn": self.inputs + item_messages(response["output"])}
        now = time.time()
        record = StoredConversation(id=response["id"], tenant=ctx.tenant, model=response["model"], created_at=now,
                                    expires_at=now + self.stored_s, previous_response_id=self.req.previous_response_id,
                                    response=orjson.dumps(response).decode(),
                                    conversation=orjson.dumps(conversation).decode())
        try:
            await ctx.state.storage.responses.put(record)
        except StoreError:
            raise store_unavailable() from None

    async def forget(self, ctx: RequestContext, response: dict | None) -> None:
        """Undo `keep` (its ledger row could not be written, so the client gets an error): best effort, a store
        that fails now leaves a row no client was given the id of, purged with its period."""
        if not self.stored_s or response is None or ctx.state.storage is None:
            return
        try:
            await ctx.state.storage.responses.delete(ctx.tenant, response["id"])
        except StoreError:
            pass
