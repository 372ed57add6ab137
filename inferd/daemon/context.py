"""What the daemon's services share while it runs: each service (inferd.daemon.services) is an async
context manager over one DaemonContext, as aiohttp's cleanup_ctx generators are over the app. A service
sets what it makes here before its `yield`, for the services after it."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from inferd.api import ServerState, StoreServices
from inferd.config import Config
from inferd.daemon.progress import StartupProgress
from inferd.daemon.purge import PURGE_INTERVAL_S, Purger
from inferd.daemon.sdnotify import Notifier
from inferd.daemon.tls import ListenerTls
from inferd.engine import Engine
from inferd.observability import Tracing

AppFactory = Callable[[ServerState], web.Application]
EngineFactory = Callable[..., Engine]


@dataclass(eq=False)
class DaemonContext:
    config: Config                      # as started (a reload swaps `state.config`)
    notifier: Notifier
    engine_factory: EngineFactory
    app_factory: AppFactory
    load_versions: Callable[[ServerState], Awaitable[None]]     # the startup's load of every configured version
    forced: asyncio.Event               # a second stop: skip waits, close at once
    run_batches: bool = True            # the Batch API's runner (tests drive their own)
    purge_every_s: float = PURGE_INTERVAL_S
    progress: StartupProgress = field(default_factory=StartupProgress)   # each model's way to serving
    # Set by the services, in the order they start.
    tls: ListenerTls | None = None      # the listener's TLS context, when [server.tls] is set
    sock: socket.socket | None = None   # the listening socket, bound before anything slow
    host: str | None = None
    port: int | None = None
    storage: StoreServices | None = None
    tracing: Tracing | None = None
    state: ServerState | None = None
    runner: web.AppRunner | None = None
    starting: web.AppRunner | None = None   # the starting app (inferd.daemon.starting) until the real site listens
    purger: Purger | None = None
