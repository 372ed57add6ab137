"""The HTTP listener as three services: the socket (bound first), the runner's release, and the site.

The socket is bound before anything slow, so a taken port fails the start at once (inferd.daemon.bind);
the app and its runner are made and the site listens last, once the engines are warm and the tenancy's
queues exist; the runner is cleaned up after the engines have closed, so handlers still streaming send
their final chunk instead of being cancelled.
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from inferd.config import check_auth_binding, check_tls_binding
from inferd.daemon.bind import bind_listener, listen_backlog
from inferd.daemon.context import DaemonContext
from inferd.daemon.listener import GuardedRunner
from inferd.daemon.starting import stop_starting
from inferd.daemon.tls import ListenerTls
from inferd.observability import get_logger

log = get_logger("inferd.daemon")

# After the drain, handlers still running (e.g. waiting in an admission queue an engine close does
# not reach) get this long before aiohttp cancels them.
HANDLER_SHUTDOWN_TIMEOUT_S = 3.0


@contextlib.asynccontextmanager
async def listen_socket(ctx: DaemonContext) -> AsyncIterator[None]:
    """The address checks, the TLS context and the bound socket (BindError names the address)."""
    cfg = ctx.config
    # Before any engine or socket: no open server on a reachable address by accident.
    check_auth_binding(cfg.auth, cfg.server.host)
    check_tls_binding(cfg.server.tls, cfg.server.host, cfg.server.allow_plaintext_non_loopback)
    if cfg.server.tls is not None:   # a certificate that does not load fails the start, naming the key
        ctx.tls = await ListenerTls.start(cfg.server.tls)
    ctx.sock = bind_listener(cfg.server.host, cfg.server.port)
    ctx.host, ctx.port = ctx.sock.getsockname()[:2]
    try:
        yield
    finally:
        ctx.sock.close()


@contextlib.asynccontextmanager
async def http_runner(ctx: DaemonContext) -> AsyncIterator[None]:
    """Where the HTTP runner is released: entered before the engines, so it is cleaned up after they
    have closed and handlers still streaming send their final chunk instead of being cancelled. `site`
    makes the runner, once the engines are warm (the app is built over a state that serves them)."""
    try:
        yield
    finally:
        runner = ctx.runner
        if runner is not None:
            if ctx.forced.is_set() and runner.server is not None:
                # Cancel whatever handler is left now rather than after HANDLER_SHUTDOWN_TIMEOUT_S.
                # (aiohttp reads a timeout of 0 as "no timeout", hence a small positive one.)
                await runner.server.shutdown(0.01)
            await runner.cleanup()


@contextlib.asynccontextmanager
async def site(ctx: DaemonContext) -> AsyncIterator[None]:
    """The app over the state behind GuardedRunner (inferd.daemon.listener: read deadlines, idle timeout
    and the connection cap, from the live [server] table, so a reload applies to new connections), and
    listening. The drain stops the site (inferd.daemon.lifecycle); `http_runner` cleans up the runner."""
    state, tls = ctx.state, ctx.tls
    # handler_cancellation: a client that goes away cancels its handler, which aborts its request.
    runner = GuardedRunner(ctx.app_factory(state), settings=lambda: state.config.server, metrics=state.metrics,
                           handle_signals=False, access_log=None, handler_cancellation=True,
                           shutdown_timeout=HANDLER_SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    ctx.runner = runner
    await web.SockSite(runner, ctx.sock, ssl_context=tls.context if tls is not None else None,
                       backlog=listen_backlog(state.config.server)).start()
    await stop_starting(ctx)        # the real app accepts on the same socket now: the starting app goes
    ctx.host, ctx.port = runner.addresses[0][:2]
    log.info("listening", host=ctx.host, port=ctx.port, tls=tls is not None, scheme="https" if tls else "http")
    yield
