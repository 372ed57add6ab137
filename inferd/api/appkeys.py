"""Typed keys for what the app and each request carry (aiohttp warns on plain string app keys)."""
from __future__ import annotations

from aiohttp import web

from inferd.api.streaming.inflight import Inflight
from inferd.api.streaming.writer_pool import WriterPool
from inferd.api.state import ServerState
from inferd.observability import RequestTrace

STATE: web.AppKey[ServerState] = web.AppKey("inferd_state", ServerState)
INFLIGHT: web.AppKey[Inflight] = web.AppKey("inferd_inflight", Inflight)
# The SSE writer processes, with [server] front_processes > 0 (inferd.api.streaming.writers).
WRITERS: web.AppKey[WriterPool] = web.AppKey("inferd_writers", WriterPool)

# Per-request values set by the front middleware.
REQUEST_ID: web.RequestKey[str] = web.RequestKey("inferd_request_id", str)
ARRIVAL: web.RequestKey[float] = web.RequestKey("inferd_arrival", float)   # monotonic stamp at arrival
LOG_FIELDS: web.RequestKey[dict] = web.RequestKey("inferd_log_fields", dict)  # for the request's log line
# This request's trace span when [tracing] is configured (inferd.observability.tracing); spillover
# forwards its context to the peer.
TRACE: web.RequestKey[RequestTrace] = web.RequestKey("inferd_trace", RequestTrace)
# Set when the response cache answered the request (inferd.api.pipeline.cached): its ledger row is billed as configured.
CACHE_HIT: web.RequestKey[bool] = web.RequestKey("inferd_cache_hit", bool)
