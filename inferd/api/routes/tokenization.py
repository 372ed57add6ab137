"""vLLM's tokenizer routes: POST /tokenize, POST /detokenize, GET /tokenizer_info.

lm-evaluation-harness's `local-completions` probes GET /tokenizer_info (it needs an `eos_token` key there)
and POST /tokenize (`{"prompt": ..., "add_special_tokens": false}`, no `model`), then counts and splits
tokens through /tokenize and /detokenize instead of downloading the model's tokenizer from a hub. Shapes
as vLLM's (vllm/entrypoints/serve/tokenize): `{count, max_model_len, tokens, token_strs}`, `{prompt}`,
and the tokenizer's configuration with at least `tokenizer_class`.

Each is an inference request as far as the tenant is concerned: the `inference` scope, one request of
its requests-per-minute (no tokens: nothing is generated) and a concurrency slot while it runs. `model`
routes as on /v1/completions (aliases, `name@version`, a cold model loads first); without one, the first
generative model the tenant may use, in GET /v1/models order. A long input is tokenized off the loop,
in the pool the request path uses (inferd.api.pipeline.prompt_tokens).
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import msgspec
import orjson
from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.auth import authenticate
from inferd.api.errors import NOT_FOUND, ApiError, draining, invalid
from inferd.api.pipeline import prompt_tokens
from inferd.api.pipeline.admit import check_model_allowed, precheck_quota, quota_error, request_deadline
from inferd.api.pipeline.body import check_json_content_type, read_body
from inferd.api.pipeline.cold_start import wait_for_model
from inferd.api.pipeline.prompt_tokens import OFF_LOOP_BYTES, OFF_LOOP_MESSAGES
from inferd.api.pipeline.versioned import model_rows, route_request
from inferd.api.state import ServerState
from inferd.api.wire.tokenization import TokenizeInput, decode_detokenize, decode_tokenize
from inferd.engine import Engine
from inferd.models import VersionLease
from inferd.tenancy import QuotaExceeded

T = TypeVar("T")
TOKENIZER_INFO_PARAMS = frozenset({"model"})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/tokenizer_info", tokenizer_info)


async def tokenize(request: web.Request) -> web.Response:
    """POST /tokenize: a prompt, or messages through the model's chat template, -> token ids."""
    state, tenant, deadline = _caller(request)
    body = await _body(request, state)
    inp = decode_tokenize(body)
    async with _serving(request, state, tenant, inp.model, deadline) as served:
        tok = served.engine.tokenizer
        big = len(body) > OFF_LOOP_BYTES or len(inp.messages or ()) > OFF_LOOP_MESSAGES
        ids, strs = await _work(lambda: _tokenize(tok, inp), big, deadline)
        answer = {"count": len(ids), "max_model_len": served.engine.info.max_model_len, "tokens": ids,
                  "token_strs": strs}
    return _json(answer, served.headers)


async def detokenize(request: web.Request) -> web.Response:
    """POST /detokenize: token ids -> text, special tokens included (as vLLM's)."""
    state, tenant, deadline = _caller(request)
    body = await _body(request, state)
    req = decode_detokenize(body)
    async with _serving(request, state, tenant, req.model, deadline) as served:
        tok = served.engine.tokenizer
        text = await _work(lambda: _detokenize(tok, req.tokens), len(body) > OFF_LOOP_BYTES, deadline)
    return _json({"prompt": text}, served.headers)


async def tokenizer_info(request: web.Request) -> web.Response:
    """GET /tokenizer_info[?model=]: the tokenizer's configuration, as vLLM's (`tokenizer_class`, the special
    tokens, the chat template), plus `model` (whose tokenizer it is) and `vocab_size`."""
    state, tenant, deadline = _caller(request)
    unknown = sorted(set(request.query) - TOKENIZER_INFO_PARAMS)
    if unknown:
        raise ApiError(400, f"Unrecognized query parameter: {unknown[0]}", param=unknown[0], code="unknown_parameter")
    async with _serving(request, state, tenant, request.query.get("model"), deadline) as served:
        answer = _info(served)
    return _json(answer, served.headers)


def _caller(request: web.Request) -> tuple[ServerState, str, float]:
    """The tenant (401/403 without the `inference` scope), refused at once (429) when over its requests per
    minute or concurrency, before its body is read; and the request's deadline (no body field sets one
    here: the X-Request-Timeout header, and the tenant's and the server's caps)."""
    state = request.app[keys.STATE]
    if state.draining:          # as the request pipeline: a draining node takes no new work
        raise draining()
    tenant = authenticate(request, "inference").tenant
    precheck_quota(state.tenancy, tenant)
    return state, tenant, request_deadline(request, None, state.tenancy, tenant, state.config.server,
                                           request[keys.ARRIVAL])


async def _body(request: web.Request, state: ServerState) -> bytes:
    check_json_content_type(request)
    return await read_body(request, state.config.server.max_body_bytes)


class Served(msgspec.Struct, kw_only=True):
    engine: Engine
    model: str                  # the model routed to (its served name)
    headers: dict[str, str]     # X-RateLimit-* after this request was charged


@contextlib.asynccontextmanager
async def _serving(request: web.Request, state: ServerState, tenant: str, model: str | None,
                   deadline: float) -> AsyncIterator[Served]:
    """The engine whose tokenizer serves `model` (the default one when None), held while the answer is made,
    with the tenant charged one request and a concurrency slot for as long."""
    requested = model if model is not None else default_model(state, tenant)
    await wait_for_model(state, requested, deadline, None)
    route = route_request(state, requested, tenant, None, request[keys.REQUEST_ID])
    version = VersionLease(state.versions)
    version.hold(route.target)      # right after routing, with nothing awaited between: a retire cannot slip in
    try:
        check_model_allowed(state.tenancy, tenant, requested, route.target.model)
        try:
            lease = state.tenancy.quota.acquire(tenant, prompt_tokens=0, max_tokens=0)
        except QuotaExceeded as exc:
            raise quota_error(exc) from None
        try:
            yield Served(engine=state.registry.table.engine(route.target), model=route.target.model,
                         headers=lease.headers)
        finally:
            lease.release(None)
    finally:
        version.release()


def default_model(state: ServerState, tenant: str) -> str:
    """The first generative model the tenant may use, as GET /v1/models lists them; 404 when there is none.
    A model not loaded (a memory budget) is judged by its configured task."""
    allows = state.tenancy.tenants.get(tenant).allows_model
    for row in model_rows(state, 0, allows):
        cfg = state.config.models.get(row["id"])
        task = row.get("task") or (cfg.task if cfg is not None and cfg.task else "generate")
        if row["kind"] == "model" and task == "generate":
            return row["id"]
    raise ApiError(404, "No generative model is served to this tenant; name one with `model` (GET /v1/models "
                   "lists them).", type=NOT_FOUND, param="model", code="model_not_found")


async def _work(work: Callable[[], T], big: bool, deadline: float) -> T:
    """Inline when small; in the tokenizer pool when long (a 504 once the deadline passes while it waits)."""
    return await prompt_tokens.POOL.run(work, deadline) if big else work()


def _tokenize(tok: Any, inp: TokenizeInput) -> tuple[list[int], list[str] | None]:
    text = inp.prompt
    if inp.messages is not None:
        try:
            text = tok.apply_chat_template(inp.messages, add_generation_prompt=inp.add_generation_prompt)
        except ValueError as exc:   # the template refused them (inferd.engine.tokenization.ChatTemplateError)
            raise invalid(f"messages: {exc}", param=getattr(exc, "param", None) or "messages",
                          code="invalid_messages") from None
    ids = tok.encode(text, add_special_tokens=inp.add_special_tokens)
    return ids, token_strs(tok, ids) if inp.return_token_strs else None


def token_strs(tok: Any, ids: Sequence[int]) -> list[str]:
    """Each id's vocabulary entry (as vLLM's convert_ids_to_tokens); a tokenizer that cannot list its
    vocabulary (the sim's) gives each token's own text instead."""
    id_to_token = getattr(tok, "id_to_token", None)
    if id_to_token is not None:
        return [id_to_token(i) or "" for i in ids]
    return [tok.decode([i], skip_special_tokens=False) for i in ids]


def _detokenize(tok: Any, ids: list[int]) -> str:
    vocab = tok.vocab_size
    for i, t in enumerate(ids):
        if t >= vocab:
            raise invalid(f"tokens[{i}]: token id {t} is outside this model's vocabulary [0, {vocab}).",
                          param="tokens", code="invalid_token_id")
    return tok.decode(ids, skip_special_tokens=False)


def _info(served: Served) -> dict:
    engine = served.engine
    tok = engine.tokenizer
    info: dict = {"tokenizer_class": type(tok).__name__, "model": served.model,
                  "bos_token": getattr(tok, "bos_token", None), "eos_token": getattr(tok, "eos_token", None),
                  "model_max_length": engine.info.max_model_len, "vocab_size": tok.vocab_size}
    template = getattr(tok, "chat_template", None)
    if isinstance(template, str) and template:
        info["chat_template"] = template        # lm-eval renders chats with it (--apply_chat_template)
    return info


def _json(body: object, headers: dict[str, str]) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)
