"""The daemon's lifecycle: startup -> serve -> shutdown, in one uvloop process (as uvicorn's serve()).

  startup   enter the services of inferd.daemon.services.SERVICES in order (socket, store, tracing,
            state, HTTP runner, engines, admission, cluster, a crashed predecessor's claims released,
            site, batch runner, purge, budgets, watchdog); then READY=1 to systemd and `daemon.ready`.
  serve     wait for a stop; SIGHUP meanwhile reloads (`Daemon.reload`, inferd.daemon.reload): validate
            the whole file, then apply the difference; RELOADING=1 ... READY=1 to systemd around it.
  shutdown  drain (readyz 503, peers told, the listener open for probes while in-flight requests get
            up to server.drain_grace_s, then it stops accepting), then leave the services in reverse:
            queued requests get 503 `draining`, engines close (open streams end with a final chunk),
            the runner cleans up, the store closes last.

We drive AppRunner + SockSite ourselves rather than web.run_app so the daemon owns its signals,
readiness and sd_notify. Signal handlers only set events (as uvicorn's do): SIGTERM / SIGINT first
drains and exits 0; a second skips the wait and exits 1. With [server.tls] the site serves HTTPS from
one SSLContext kept for its whole life (inferd.daemon.tls), so a SIGHUP can load a new certificate
into it without touching open connections.

Tests run the whole lifecycle in-process: `Daemon(config).run()` in a task, `await daemon.ready.wait()`,
read `daemon.port`, then `daemon.request_stop()`. `inferd serve` and `run_daemon` are in inferd.daemon.serve.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from aiohttp import web

from inferd.api import ServerState
from inferd.cluster import ClusterKeyError
from inferd.config import Config, InsecureBindError
from inferd.daemon.context import AppFactory, DaemonContext, EngineFactory
from inferd.daemon.engines import load_versions
from inferd.daemon.progress import StartupProgress
from inferd.daemon.purge import PURGE_INTERVAL_S, Purger
from inferd.daemon.reload import ReloadResult, Reloader
from inferd.daemon.reload_steps import reload_steps
from inferd.daemon.sdnotify import Notifier
from inferd.daemon.services import SERVICES
from inferd.daemon.tls import ListenerTls, TlsError
from inferd.daemon.version_reload import ModelsReload
from inferd.models import ControlPlane, EngineConfigError, build_engine
from inferd.observability import TracingUnavailable, get_logger, tune_collector
from inferd.store import StoreError
from inferd.tenancy import KeyFileError

log = get_logger("inferd.daemon")

# What a start can expect to fail with (logged without a traceback).
STARTUP_ERRORS = (EngineConfigError, OSError, InsecureBindError, KeyFileError, TlsError, ClusterKeyError,
                  StoreError, TracingUnavailable)


def _default_app_factory(state: ServerState) -> web.Application:
    from inferd.api import make_app

    return make_app(state)


class Daemon:
    def __init__(self, config: Config, *, app_factory: AppFactory | None = None,
                 engine_factory: EngineFactory = build_engine, notifier: Notifier | None = None,
                 config_path: str | Path | None = None, run_batches: bool = True,
                 purge_every_s: float = PURGE_INTERVAL_S, tune_collector: bool = False) -> None:
        self.config = config
        # Once ready, collect less often (inferd.observability.garbage): what a daemon process does; not an
        # embedded one, which shares its process (a test's) with others.
        self._tune_collector = tune_collector
        self.config_path = config_path        # what SIGHUP re-reads (None: reload has nothing to read)
        self.reloader: Reloader | None = None
        self._notifier = notifier or Notifier()
        self.ready = asyncio.Event()       # set once listening and serving
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._stop_requests = 0
        self._tasks: set[asyncio.Task] = set()
        # What the services share; `load_versions` late-bound, so a test can slow the load down.
        self._ctx = DaemonContext(config=config, notifier=self._notifier, engine_factory=engine_factory,
                                  app_factory=app_factory or _default_app_factory,
                                  load_versions=lambda state: self._load_versions(state), forced=self._force,
                                  run_batches=run_batches, purge_every_s=purge_every_s)

    # -- what the services made (None until they have) ----------------------------------------
    @property
    def state(self) -> ServerState | None:
        return self._ctx.state

    @property
    def control(self) -> ControlPlane | None:
        return self.state.control if self.state is not None else None

    @property
    def tls(self) -> ListenerTls | None:
        """The listener's TLS context, when [server.tls] is set."""
        return self._ctx.tls

    @property
    def host(self) -> str | None:
        return self._ctx.host

    @property
    def port(self) -> int | None:
        return self._ctx.port

    @property
    def progress(self) -> StartupProgress:
        """Each model's way to serving (what /readyz shows while starting)."""
        return self._ctx.progress

    @property
    def purger(self) -> Purger | None:
        return self._ctx.purger

    # -- control (signal handlers and tests call these; they only set events) --------------
    def request_stop(self) -> None:
        """First call: drain and exit. A second call: exit at once, skipping the drain wait."""
        self._stop_requests += 1
        self._stop.set()
        if self._stop_requests > 1:
            self._force.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_reload(self) -> None:
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.add(task)  # keep a reference until done: the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)

    async def reload(self, path: str | Path | None = None) -> ReloadResult | None:
        """SIGHUP: re-read the config file and apply it (inferd.daemon.reload). Returns a ReloadResult,
        or None when there is nothing to reload (not started yet, draining, no config file)."""
        path = path or self.config_path
        if self.reloader is None or self.stopping or path is None:
            log.warning("reload_skipped", reason="no config file" if path is None else "not serving",
                        message="config unchanged")
            return None
        log.info("reloading", config=str(path))
        self._notifier.reloading()
        try:
            return await self.reloader.reload(path)
        finally:
            self.config = self.state.config
            if not self.stopping:
                self._notifier.ready(self._status())

    def _status(self) -> str:
        return f"serving {', '.join(self.state.engines)} on {self.host}:{self.port}"

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        log.info("signal", signal=name, forced=self._stop_requests > 0)
        self.request_stop()

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self, *, install_signals: bool = False) -> int:
        """Run until stopped. Returns the process exit code: 0 clean, 1 forced or failed start."""
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
            loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        try:
            return await self._serve()
        finally:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
            self._notifier.close()

    async def _serve(self) -> int:
        async with contextlib.AsyncExitStack() as services:      # left in reverse on the way out
            failed = await self._startup(services)
            if failed is not None:
                return failed
            await self._stop.wait()                               # the main loop: serve until stopped
            await self._drain()
        log.info("stopped", forced=self._force.is_set())
        return 1 if self._force.is_set() else 0

    async def _startup(self, services: contextlib.AsyncExitStack) -> int | None:
        """Start every service, unless a stop comes first (then what started is released). None once
        serving; else the exit code: a failed start (logged as `startup_failed`) or an abandoned one."""
        startup = asyncio.ensure_future(self._start_services(services))
        stopper = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({startup, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not startup.done():  # stopped while starting: abandon startup, release what it got
            startup.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await startup
            log.info("stopped_during_startup")
            return 1 if self._force.is_set() else 0
        try:
            startup.result()
        except STARTUP_ERRORS as exc:  # expected
            log.error("startup_failed", error=str(exc), error_type=type(exc).__name__)
            return 1
        except Exception as exc:  # noqa: BLE001 - a bug or an engine failure: keep the traceback
            log.exception("startup_failed", error=str(exc), error_type=type(exc).__name__)
            return 1
        return None

    async def _start_services(self, services: contextlib.AsyncExitStack) -> None:
        for service in SERVICES:
            await services.enter_async_context(service(self._ctx))
        state = self.state
        models = ModelsReload(state)
        self.reloader = Reloader(state, reload_steps(state, models, self.tls), models.wait_retired)
        state.started = True
        thresholds = tune_collector() if self._tune_collector else None
        log.info("ready", models=list(state.engines), gc_thresholds=thresholds,
                 versions=[str(k) for k in state.registry.table.versions], refused=list(state.versions.failures))
        self._notifier.ready(self._status())
        self.ready.set()

    async def _load_versions(self, state: ServerState) -> None:
        await load_versions(state, self._ctx.progress)

    async def _drain(self) -> None:
        """Stop taking work; what is still running gets server.drain_grace_s, then the listener closes.
        The services' teardown (in reverse) ends whatever is left."""
        state, runner = self.state, self._ctx.runner
        state.draining = True
        self._notifier.stopping()
        if state.cluster is not None:   # peers stop spilling to us now, not after a suspicion timeout
            await state.cluster.leave()
        log.info("draining", in_flight=state.in_flight, grace_s=self.config.server.drain_grace_s)
        # The listener stays open while in-flight work finishes, so load balancers' probes see /readyz
        # answer 503 (a refused connect looks like a crash) and new inference requests get 503
        # `draining` with Retry-After; keep-alive connections close after their current request.
        if runner.server is not None:
            runner.server.pre_shutdown()
        if not await self._wait_drained(state):
            log.warning("drain_incomplete", in_flight=state.in_flight, forced=self._force.is_set())
        for site in list(runner.sites):
            await site.stop()                  # now stop accepting connections

    async def _wait_drained(self, state: ServerState) -> bool:
        if self._force.is_set():
            return state.in_flight == 0
        idle = asyncio.ensure_future(state.wait_idle(self.config.server.drain_grace_s))
        forced = asyncio.ensure_future(self._force.wait())
        await asyncio.wait({idle, forced}, return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if not idle.done():
            idle.cancel()
            return False
        return idle.result()
