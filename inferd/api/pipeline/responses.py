"""The Responses API's own part of the generation pipeline: its decode stage, and its output (the
Response object, its event encoder, and keeping it in the store).

POST /v1/responses runs chat's stages (keys, quotas, fair admission, the ledger, idempotency, SLOs,
safety filters) over a Prepared of kind "responses": instructions as the system message, then the
stored conversation of `previous_response_id`, then `input`. Only `decode` differs; the output stage
(inferd.api.pipeline.respond) asks `ctx.extras["output"]` (a ResponsesOutput) for its encoder and body.

Storing follows the tenant's retention (docs/privacy.md): a tenant whose retention is a period has its
responses stored by default, kept for that period; a tenant with retention "none" (or a server with no
store) stores nothing, and `store: true` is a 400 naming `store`. A stored response is committed before
its client gets the last of it (the final event, or the body), so a `previous_response_id` naming it
works at once, and after a restart.
"""
from __future__ import annotations

import time
from typing import Any

import orjson

from inferd.api.errors import NOT_FOUND, ApiError, invalid, store_unavailable
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


def not_found(response_id: str, param: str | None) -> ApiError:
    """Unknown, expired and another tenant's are the same answer: ids cannot be probed across tenants."""
    return ApiError(404, f"Response with id {response_id!r} not found.", type=NOT_FOUND, param=param,
                    code="response_not_found")


async def decode_request(ctx: RequestContext) -> None:
    """The body as a ResponsesRequest (400 naming the field), whether it is stored, and the conversation it
    continues (404 naming previous_response_id when that is not this tenant's, or no longer kept)."""
    req: ResponsesRequest = decode_with(_DECODER, ctx.body)
    prepared, inputs = prepare(req)
    state = ctx.state
    retention = state.tenancy.tenants.get(ctx.tenant).retention_s if state.storage is not None else 0.0
    if req.store and not retention:
        why = ("its retention keeps no text (retention \"none\")" if state.storage is not None
               else "this server has no durable store")
        raise invalid(f"store: this tenant's responses cannot be stored: {why}; send store: false.",
                      param="store", code="store_not_allowed")
    before: list[dict] = []
    if req.previous_response_id is not None:
        before = await _conversation(ctx, req.previous_response_id)
        head = prepared.messages[:1] if req.instructions else []
        prepared.messages = head + before + inputs
        prepared.prompt_chars = prompt_chars(prepared.messages)
    ctx.wire, ctx.prepared = req, prepared
    stored = retention if req.store is not False else 0.0
    ctx.extras["output"] = ResponsesOutput(req, before + inputs, stored)


async def _conversation(ctx: RequestContext, response_id: str) -> list[dict]:
    """The chat messages the stored response `response_id` ends with (its input, then its output)."""
    found = await find_stored(ctx.state, ctx.tenant, response_id)
    if found is None:
        raise not_found(response_id, "previous_response_id")
    return orjson.loads(found.conversation)


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

    def __init__(self, req: ResponsesRequest, conversation: list[dict], stored_s: float) -> None:
        self.req = req
        self.conversation = conversation    # the messages this response continues, its own input last
        self.stored_s = stored_s            # how long it is kept (0: not stored)
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
        """Store `response` (the whole Response) with the conversation it ends, when it is to be stored;
        a store that fails is a 503, so the client never holds an id that names nothing."""
        if not self.stored_s or response is None or ctx.state.storage is None:
            return
        conversation = self.conversation + item_messages(response["output"])
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
