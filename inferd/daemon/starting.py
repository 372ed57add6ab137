"""The listener while the daemon starts: bound first, answering before any engine is built or loaded.

Building and loading models takes seconds to minutes; until now the port refused connections for all
of it, which a load balancer or `curl` reads as a crash. So as soon as the socket is bound, a small app
serves on a dup() of it (the same listening socket: one accept queue, so nothing is refused when the
real app takes over):

    /healthz, /health   200 {"status": "ok"}: the process is alive
    /readyz             503 {"status": "starting", "models": {name: {phase, done?, total?, ...}}} with the
                        OpenAI error envelope (code `starting`) and Retry-After: per model where it is
                        (inferd.daemon.progress)
    anything else       503 `starting` with Retry-After, in the OpenAI envelope

It is behind the same GuardedRunner as the real app (read deadlines, idle timeout, connection cap and
probe reserve), over the same TLS context. Every answer closes its connection, so no client stays
attached to it; once the real site listens on the socket, `stop_starting` closes this one's dup, and
the next connection is accepted by the real app.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
from aiohttp import web

from inferd.api import SERVER_HEADER
from inferd.daemon.bind import listen_backlog
from inferd.daemon.context import DaemonContext
from inferd.daemon.listener import GuardedRunner
from inferd.daemon.progress import StartupProgress
from inferd.observability import Metrics, get_logger

log = get_logger("inferd.daemon")

RETRY_AFTER_S = 1
HANDOVER_GRACE_S = 1.0      # connections the starting app accepted get this long to be answered
HANDOVER_POLL_S = 0.01
_HEALTH_PATHS = frozenset({"/healthz", "/health"})


def starting_app(progress: StartupProgress) -> web.Application:
    """One catch-all handler: the real routes are not there yet, so every path is answered here."""

    async def handle(request: web.Request) -> web.Response:
        if request.path in _HEALTH_PATHS and request.method in ("GET", "HEAD"):
            resp = _json({"status": "ok"}, 200)
        elif request.path == "/readyz":
            resp = _readyz(progress)
        else:
            resp = _json({"error": _STARTING}, 503)
        resp.headers["Server"] = SERVER_HEADER
        resp.force_close()      # nothing stays attached to this app: the next request meets the real one
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


# The OpenAI envelope, as inferd.api's `unavailable` writes it (the api's error helpers are its inside).
_STARTING = {"message": "The server is starting (models are being built and loaded); GET /readyz shows each "
                        "model's progress. Retry shortly.",
             "type": "service_unavailable_error", "param": None, "code": "starting"}


def _json(body: dict, status: int) -> web.Response:
    resp = web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
    if status == 503:
        resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    return resp


def _readyz(progress: StartupProgress) -> web.Response:
    return _json({"status": "starting", "reasons": ["engines are still starting"], "models": progress.snapshot(),
                  "error": _STARTING}, 503)


@contextlib.asynccontextmanager
async def starting_site(ctx: DaemonContext) -> AsyncIterator[None]:
    """Serve `starting_app` on a dup() of the bound socket until `site` takes over (or the start fails)."""
    cfg, tls = ctx.config, ctx.tls
    runner = GuardedRunner(starting_app(ctx.progress), settings=lambda: cfg.server, metrics=Metrics(),
                           handle_signals=False, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    ctx.starting = runner
    try:
        await web.SockSite(runner, ctx.sock.dup(), ssl_context=tls.context if tls is not None else None,
                           backlog=listen_backlog(cfg.server)).start()
        scheme = "https" if tls is not None else "http"
        # `listening` stays the real app's line (serving every route); this one says probes answer now.
        log.info("accepting", host=ctx.host, port=ctx.port, scheme=scheme,
                 url=f"{scheme}://{_url_host(ctx.host)}:{ctx.port}",
                 message="answering /healthz and /readyz (503 starting) while models are built and loaded")
        yield
    finally:
        await stop_starting(ctx)


async def stop_starting(ctx: DaemonContext) -> None:
    """Close the starting app's dup of the socket (the real site keeps the original), then its connections
    once each has had its answer (at most HANDOVER_GRACE_S: one accepted just before the hand-over may not
    have sent its request yet, and closing it unanswered would look like a reset to its client)."""
    runner, ctx.starting = ctx.starting, None
    if runner is None:
        return
    for accepting in list(runner.sites):
        await accepting.stop()
    deadline = asyncio.get_running_loop().time() + HANDOVER_GRACE_S
    while runner.server is not None and runner.server.connections and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(HANDOVER_POLL_S)
    await runner.cleanup()


def _url_host(host: str | None) -> str:
    return f"[{host}]" if host and ":" in host else str(host)
