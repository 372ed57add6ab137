"""The HTTP listener's guards: read deadlines, an idle timeout and a connection cap, per connection.

aiohttp's RequestHandler (one per connection) has only `keepalive_timeout`, and that clock starts at the
last response, not at the first byte of a request: a client that drips its headers, or promises a body
and never sends it, holds the connection (and a file descriptor) for as long as it likes. So each
connection here is in one phase, with at most one timer:

    idle     no request in progress (just accepted, or between keep-alive requests)   server.idle_timeout_s
    headers  a request's first byte arrived, its headers have not all arrived           server.header_timeout_s
    body     headers parsed, the body not complete                                       server.body_timeout_s
    busy     the handler runs (an SSE stream may last minutes): no timer at all

The phase changes once per request (first byte, request created, response finished), never per SSE
frame or per body chunk beyond one `is_eof()`; a timer that fires closes the connection and counts
inferd_http_connections_cut_total{reason="idle|header_timeout|body_timeout"}.

The cap: `server.max_connections` connections serve any route; the next `server.probe_connections` are
accepted for /healthz and /readyz only (any other path gets 503 `too_many_connections`, and the
connection closes after one request), so probes still answer while the serving slots are full; beyond
both, a new connection is closed as soon as it is accepted (reason="over_cap"), before any parser work.

Requests the parser refuses (bad request line, header too large, CL+TE) are answered with the OpenAI
envelope (inferd.api) and logged as one short line, at most PROTOCOL_LOG_PER_S a second; the rest are
counted in inferd_http_protocol_errors_total and reported as `suppressed` on the next line logged.

Limits are read from the live config when a connection is accepted, so after a SIGHUP new connections
get the new values and open ones keep theirs.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from inferd.api import internal_error_response, protocol_error_response, too_many_connections_response
from inferd.config import ServerConfig
from inferd.observability import Metrics, get_logger

log = get_logger("inferd.listener")

PROBE_PATHS = frozenset({"/healthz", "/health", "/readyz"})
PROTOCOL_LOG_PER_S = 5

_IDLE, _HEADERS, _BODY, _BUSY = "idle", "headers", "body", "busy"
_CUT_REASON = {_IDLE: "idle", _HEADERS: "header_timeout", _BODY: "body_timeout"}
_SERVE, _PROBE_ONLY, _REFUSE = "serve", "probe_only", "refuse"


class RateLimitedLog:
    """At most `per_second` lines a second; the lines dropped are counted into the next one logged."""

    def __init__(self, per_second: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._per_second = per_second
        self._clock = clock
        self._window = float("-inf")
        self._logged = 0
        self.suppressed = 0

    def allow(self) -> int | None:
        """None: drop this line. Else log it, with the returned count of lines dropped since the last."""
        now = self._clock()
        if now - self._window >= 1.0:
            self._window, self._logged = now, 0
        if self._logged >= self._per_second:
            self.suppressed += 1
            return None
        self._logged += 1
        dropped, self.suppressed = self.suppressed, 0
        return dropped


class GuardedServer(web.Server):
    """aiohttp's Server with a connection cap, a probe reserve and GuardedHandler connections."""

    def __init__(self, handler: Any, *, settings: Callable[[], ServerConfig], metrics: Metrics,
                 **kwargs: Any) -> None:
        super().__init__(self._handle_by_slot, **kwargs)
        self._app_handler = handler
        self._settings = settings
        self.metrics = metrics
        self._handler_kwargs = {k: v for k, v in kwargs.items()
                                if k not in ("request_factory", "handler_cancellation", "loop")}
        self.serving = 0            # connections holding a serving slot
        self.probe_only = 0         # connections holding a probe slot
        self._open: dict[GuardedHandler, None] = {}    # holding a slot, oldest first (insertion order)
        self.protocol_log = RateLimitedLog(PROTOCOL_LOG_PER_S)
        metrics.watch_connections(lambda: self.serving + self.probe_only)

    def __call__(self) -> GuardedHandler:
        # The protocol factory, once per accepted connection: this connection's limits, from the live config.
        s = self._settings()
        # aiohttp's own keep-alive timer stays as a backstop only: it can never fire before ours do.
        backstop = s.idle_timeout_s + s.header_timeout_s + 1.0
        return GuardedHandler(self, loop=self._loop, limits=s, **{**self._handler_kwargs,
                                                                   "keepalive_timeout": backstop})

    def admit(self, handler: GuardedHandler) -> str:
        s = self._settings()
        if self.serving < s.max_connections:
            self.serving += 1
            slot = _SERVE
        elif self.probe_only < s.probe_connections:
            self.probe_only += 1
            slot = _PROBE_ONLY
        else:
            # Full. Slow clients that never completed a request must not lock everyone out (probes
            # included) until their timers fire: the oldest such connection gives its slot to the
            # newcomer. A client that was served once (an idle keep-alive) is never evicted for it.
            victim = next((h for h in self._open if h.served == 0 and h.phase != _BUSY), None)
            self.metrics.count_connection_cut("over_cap")
            if victim is None:
                return _REFUSE
            slot = victim.evict()
        self._open[handler] = None
        return slot

    def release(self, handler: GuardedHandler) -> None:
        if handler not in self._open:      # evicted: its slot went to a newcomer
            return
        del self._open[handler]
        if handler.slot == _SERVE:
            self.serving -= 1
        elif handler.slot == _PROBE_ONLY:
            self.probe_only -= 1

    async def _handle_by_slot(self, request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        if isinstance(protocol, GuardedHandler) and protocol.slot == _PROBE_ONLY:
            if request.path not in PROBE_PATHS:
                self.metrics.count_connection_cut("over_cap")
                return too_many_connections_response()
            resp = await self._app_handler(request)
            resp.force_close()             # free the probe slot for the next probe
            return resp
        return await self._app_handler(request)


class GuardedHandler(RequestHandler):
    """One connection: aiohttp's RequestHandler plus the phase timer, the slot and enveloped protocol errors."""

    def __init__(self, manager: GuardedServer, *, limits: ServerConfig, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager
        self._limits = limits
        self.slot = _REFUSE
        self.served = 0             # requests answered on this connection
        self.phase = _IDLE
        self._timer: asyncio.TimerHandle | None = None
        self._body: Any = None      # the current request's payload (a StreamReader) while in `body`
        # Called first when the connection is lost, while its socket is still open: the stream being written
        # reads what its client acknowledged (inferd.api.streaming.accepted.SocketAccepted sets it).
        self.on_lost: Callable[[], None] | None = None

    # -- connection ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.slot = self._guard.admit(self)
        if self.slot == _REFUSE:
            transport.close()       # before aiohttp starts a task or a parser for it: refusing is cheap
            return
        super().connection_made(transport)
        self._arm(_IDLE, self._limits.idle_timeout_s)

    def connection_lost(self, exc: BaseException | None) -> None:
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            try:
                on_lost()
            except Exception:   # the connection's own cleanup below must run whatever a stream's sample did
                log.exception("on_lost_failed")
        self._disarm()
        if self.slot == _REFUSE:
            return                  # never handed to aiohttp
        self._guard.release(self)
        self.slot = _REFUSE
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.phase == _IDLE and data:
            self._arm(_HEADERS, self._limits.header_timeout_s)
        super().data_received(data)
        if self.phase == _BODY and self._body.is_eof():
            self._body = None
            self._disarm(_BUSY)

    # -- request phases (called by aiohttp once per request) ----------------------------------------
    def request_started(self, payload: Any) -> None:
        """Headers parsed and the request created (GuardedRunner's request factory)."""
        if payload.is_eof():
            self._disarm(_BUSY)
        else:
            self._body = payload
            self._arm(_BODY, self._limits.body_timeout_s)

    def handler_reads_body(self) -> None:
        """The handler reads the body itself, with a timeout on each read (an upload paced to the node's
        upload rate may take minutes while never stalling): the body's total deadline no longer applies."""
        if self.phase == _BODY:
            self._body = None
            self._disarm(_BUSY)

    async def finish_response(self, request: web.BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        result = await super().finish_response(request, resp, start_time)
        self.served += 1
        if self.phase != _BODY:     # an unread body keeps its deadline while aiohttp lingers over it
            self._arm(_IDLE, self._limits.idle_timeout_s)
        return result

    def evict(self) -> str:
        """Close this connection to free its slot for a newcomer; returns the slot, no longer this one's."""
        self._guard._open.pop(self, None)   # its connection_lost must not release the slot again
        self._disarm()
        log.debug("connection_cut", reason="over_cap", remote=_remote(self.transport))
        if self.transport is not None:
            self.transport.close()
        return self.slot

    def _arm(self, phase: str, timeout_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.phase = phase
        self._timer = self._loop.call_later(timeout_s, self._expire)

    def _disarm(self, phase: str | None = None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if phase is not None:
            self.phase = phase

    def _expire(self) -> None:
        self._timer = None
        reason = _CUT_REASON.get(self.phase)
        if reason is None or self.transport is None:
            return
        self._guard.metrics.count_connection_cut(reason)
        log.debug("connection_cut", reason=reason, remote=_remote(self.transport))
        self.force_close()

    # -- errors aiohttp answers itself --------------------------------------------------------------
    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """aiohttp's version logs a traceback at ERROR for every malformed request and answers text/plain;
        this one logs one short rate-limited line and answers with the OpenAI envelope."""
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error response")
        if isinstance(exc, HttpProcessingError) and status < 500:
            reason, resp = protocol_error_response(exc)
            self._guard.metrics.count_protocol_error(reason)
            self._log_refusal("http_protocol_error", reason=reason, status=resp.status)
            return resp
        # aiohttp calls this inside its `except Exception` block, so log.exception has the traceback.
        self._log_refusal("http_internal_error", status=status, error_type=type(exc).__name__, traceback=True)
        return internal_error_response()

    def _log_refusal(self, event: str, *, traceback: bool = False, **fields: Any) -> None:
        dropped = self._guard.protocol_log.allow()
        if dropped is None:
            return
        if dropped:
            fields["suppressed"] = dropped
        remote = _remote(self.transport)
        if traceback:   # a bug, not a client's garbage: keep the traceback (rate-limited all the same)
            log.exception(event, remote=remote, **fields)
        else:
            log.warning(event, remote=remote, **fields)


def _remote(transport: asyncio.BaseTransport | None) -> str | None:
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if peer else None


class GuardedRunner(web.AppRunner):
    """AppRunner whose server is a GuardedServer (same app handler, request factory and options)."""

    def __init__(self, app: web.Application, *, settings: Callable[[], ServerConfig], metrics: Metrics,
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._settings = settings
        self._metrics = metrics

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()     # runs the app's startup and freezes it
        app_factory = plain.request_factory

        def request_factory(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
            if isinstance(protocol, GuardedHandler):
                protocol.request_started(payload)
            return app_factory(message, payload, protocol, writer, task)

        return GuardedServer(plain.request_handler, settings=self._settings, metrics=self._metrics,
                             request_factory=request_factory, handler_cancellation=plain.handler_cancellation,
                             loop=asyncio.get_running_loop(),
                             **plain._kwargs)   # the RequestHandler options AppRunner gathered (no public getter)
