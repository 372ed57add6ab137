"""The aiohttp application: routes, and the one middleware every request passes through.

The middleware stamps the arrival time, keeps a well-formed client `X-Request-Id` (else makes
one), puts it in the log context, turns every error into the OpenAI envelope (our ApiErrors,
aiohttp's own 404/405/413, and anything unexpected as a logged 500 that carries the request id
and no traceback), and writes the request's single log line.
"""
from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from inferd.api.admin import models as admin_models
from inferd.api.admin import rollouts as admin
from inferd.api import console
from inferd.api.routes import batches, files, ops, stored_responses, tokenization
from inferd.api import appkeys as keys
from inferd.api.auth import count_tenant_request
from inferd.api.pipeline.run import create_chat_completion, create_completion, create_embedding, create_response
from inferd.api.errors import (SERVER_ERROR, SERVER_HEADER, ApiError, error_response, from_http_exception,
                               store_unavailable)
from inferd.api.streaming.inflight import Inflight
from inferd.api.streaming.writer_pool import WriterPool
from inferd.api.state import ServerState
from inferd.config import resolve_front_processes
from inferd.observability import get_logger, request_id_var, truncated_path
from inferd.store import StoreUnavailable

log = get_logger("inferd.api")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})   # scraped every few seconds: debug level

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(state: ServerState) -> web.Application:
    """The HTTP app over a ServerState (inferd.api.state); handlers read `state` on every request."""
    app = web.Application(middlewares=[front_middleware],
                          # read_body() enforces server.max_body_bytes itself (reload-aware); this is
                          # only aiohttp's ceiling for request.read(), which our handlers never call.
                          client_max_size=state.config.server.max_body_bytes)
    app[keys.STATE] = state
    app.on_response_prepare.append(_server_header)
    inflight = Inflight(lambda: state.config.server.heartbeat_interval_s)
    app[keys.INFLIGHT] = inflight
    app.cleanup_ctx.append(inflight.cleanup_ctx)
    front_processes = resolve_front_processes(state.config.server.front_processes)
    if front_processes > 0:     # read once: a reload keeps it as running (inferd.daemon.reload)
        writers = app[keys.WRITERS] = WriterPool(front_processes)
        app.cleanup_ctx.append(writers.cleanup_ctx)
    app.router.add_post("/v1/completions", create_completion)
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_post("/v1/embeddings", create_embedding)
    app.router.add_post("/v1/responses", create_response)      # OpenAI's Responses API
    stored_responses.add_routes(app)       # GET and DELETE /v1/responses/{id}
    app.router.add_get("/v1/models", ops.list_models)
    app.router.add_get("/v1/models/{model}", ops.retrieve_model)
    app.router.add_get("/healthz", ops.healthz)
    app.router.add_get("/health", ops.healthz)      # vLLM's name; load tools (guidellm) probe it
    app.router.add_get("/readyz", ops.readyz)
    app.router.add_get("/metrics", ops.metrics)
    app.router.add_get("/openapi.json", ops.openapi)
    admin.add_routes(app)
    admin_models.add_routes(app)    # the model lifecycle under a memory budget: list, load, unload
    files.add_routes(app)      # the Batch API: its input and output files
    batches.add_routes(app)
    tokenization.add_routes(app)   # vLLM's /tokenize, /detokenize, /tokenizer_info (lm-eval's remote tokenizer)
    console.add_routes(app)        # the operator's console, /admin/ui (HTML, behind an admin sign-in)
    return app


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    # aiohttp's default `Server` header names the Python and aiohttp versions; say only what we are.
    # Once per response (at prepare), never per SSE frame.
    response.headers["Server"] = SERVER_HEADER


def request_id_for(request: web.BaseRequest) -> str:
    supplied = request.headers.get("X-Request-Id")
    if supplied is not None and _REQUEST_ID.fullmatch(supplied):
        return supplied
    return "req-" + secrets.token_hex(12)


def logged_path(request: web.BaseRequest) -> str:
    """The path as a log line carries it (inferd.observability.log.truncated_path)."""
    return truncated_path(request.path)


def _unless_started(request: web.Request, err: ApiError) -> web.StreamResponse:
    """`err`'s response, for a handler that raised. If its own response is partly out already, no other
    can follow: the connection is ended instead, or the client would wait for the rest of a chunked
    body that never comes."""
    if request.writer.output_size and request.transport is not None:
        request.transport.close()
    return error_response(err, request[keys.REQUEST_ID])


@web.middleware
async def front_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    arrival = time.monotonic()
    rid = request_id_for(request)
    request[keys.ARRIVAL] = arrival
    request[keys.REQUEST_ID] = rid
    fields: dict = {}
    request[keys.LOG_FIELDS] = fields
    token = request_id_var.set(rid)
    status = 500
    try:
        try:
            resp = await handler(request)
        except ApiError as err:
            resp = error_response(err, rid)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise                                       # redirects and the like pass through
            limit = request.app[keys.STATE].config.server.max_body_bytes
            resp = error_response(from_http_exception(exc, limit), rid)
        except asyncio.CancelledError:
            status = 499                                    # the client left (handler cancellation)
            raise
        except StoreUnavailable as exc:     # the store failed under a request (an idempotency key, say)
            log.error("store_unavailable", method=request.method, path=logged_path(request), error=str(exc))
            resp = _unless_started(request, store_unavailable())
        except ConnectionError:
            # The client left mid-request; aiohttp drops whatever we return for a closed transport
            # (re-raising would have it log a traceback and answer 500).
            resp = web.Response(status=499)
        except Exception:
            log.exception("unhandled_error", method=request.method, path=logged_path(request))
            resp = _unless_started(request, ApiError(500, f"Internal server error (request id {rid}).",
                                                     type=SERVER_ERROR, code="internal_error"))
        if not resp.prepared:
            resp.headers["X-Request-Id"] = rid
        status = resp.status
        return resp
    finally:
        count_tenant_request(request, fields.get("outcome_status", status))
        quiet = request.path in _QUIET_PATHS and status < 400
        if not quiet or log.is_enabled("debug"):
            emit = log.debug if quiet else log.info
            emit("request", method=request.method, path=logged_path(request), status=status,
                 duration_ms=round((time.monotonic() - arrival) * 1000, 3), **fields)
        request_id_var.reset(token)
