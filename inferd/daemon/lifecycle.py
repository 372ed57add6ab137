"""The daemon's lifecycle: startup -> serve -> drain -> cleanup, in one uvloop process.

Resources are acquired in order (engines, then the HTTP listener) on an AsyncExitStack and
released in reverse, like aiohttp's cleanup_ctx. We drive AppRunner + TCPSite ourselves rather
than web.run_app so the daemon owns its signals, readiness and sd_notify. Signal handlers only
set events (as uvicorn's do):
  SIGTERM / SIGINT  first: drain (readyz 503, stop listening, wait for in-flight requests up to
                    server.drain_grace_s, close engines, exit 0); second: skip the wait, exit 1.
  SIGHUP            reload (`Daemon.reload`, inferd.daemon.reload): validate the whole file, then apply the
                    difference; RELOADING=1 ... READY=1 to systemd around it.
With [server.tls] the site serves HTTPS from one SSLContext kept for its whole life (inferd.daemon.tls),
so a SIGHUP can load a new certificate into it without touching open connections.
Versions (inferd.models.versions) are verified, started and warmed one by one; a refused version is logged
and the rest serve (startup fails only when nothing loads).

Tests run the whole lifecycle in-process: `Daemon(config).run()` in a task, `await daemon.ready.wait()`,
read `daemon.port`, then `daemon.request_stop()`. `inferd serve` and `run_daemon` are in inferd.daemon.serve;
the first-run build of a missing synthetic artifact is inferd.daemon.synthetic_build.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from inferd.api import ServerState
from inferd.cluster import ClusterKeyError
from inferd.config import Config, InsecureBindError, check_auth_binding, check_tls_binding
from inferd.daemon.bind import bind_listener
from inferd.daemon.listener import GuardedRunner
from inferd.daemon.reload import Reloader, routes_changed, unloaded_hook
from inferd.daemon.sdnotify import Notifier
from inferd.daemon.services import open_store, start_services
from inferd.daemon.synthetic_build import build_synthetic_artifact
from inferd.daemon.tls import ListenerTls, TlsError
from inferd.engine import Engine
from inferd.models import (
    ControlPlane,
    EngineConfigError,
    ModelLifecycle,
    ModelRegistry,
    run_prewarm_schedule,
    ShadowDispatcher,
    VersionManager,
    build_engine,
    missing_synthetic,
    routes_from_config,
    version_specs,
)
from inferd.observability import Tracing, TracingUnavailable, get_logger
from inferd.store import IdempotencyStore, Ledger, StoreError, Transcripts
from inferd.tenancy import KeyFileError, Tenancy

log = get_logger("inferd.daemon")

AppFactory = Callable[[ServerState], web.Application]
EngineFactory = Callable[..., Engine]

# After the drain, handlers still running (e.g. waiting in an admission queue an engine close does
# not reach) get this long before aiohttp cancels them.
HANDLER_SHUTDOWN_TIMEOUT_S = 3.0
# A forced exit still asks each engine to close, but waits at most this long for it.
FORCED_CLOSE_TIMEOUT_S = 2.0


def _default_app_factory(state: ServerState) -> web.Application:
    from inferd.api import make_app

    return make_app(state)


class Daemon:
    def __init__(self, config: Config, *, app_factory: AppFactory | None = None,
                 engine_factory: EngineFactory = build_engine, notifier: Notifier | None = None,
                 config_path: str | Path | None = None, run_batches: bool = True) -> None:
        self.config = config
        self.config_path = config_path        # what SIGHUP re-reads (None: reload has nothing to read)
        self.control: ControlPlane | None = None
        self.reloader: Reloader | None = None
        self._app_factory = app_factory or _default_app_factory
        self._engine_factory = engine_factory
        self._notifier = notifier or Notifier()
        self._run_batches = run_batches       # the Batch API's runner (tests drive their own)
        self.state: ServerState | None = None
        self.tls: ListenerTls | None = None   # the listener's TLS context, when [server.tls] is set
        self.host: str | None = None
        self.port: int | None = None
        self.ready = asyncio.Event()       # set once listening and serving
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._stop_requests = 0
        self._tasks: set[asyncio.Task[None]] = set()

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

    async def reload(self, path: str | Path | None = None):
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
            return await self._run()
        finally:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
            self._notifier.close()

    async def _run(self) -> int:
        async with contextlib.AsyncExitStack() as stack:
            startup = asyncio.ensure_future(self._startup(stack))
            stopper = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({startup, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not startup.done():  # stopped while starting: abandon startup, release what it got
                startup.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await startup
                log.info("stopped_during_startup")
                return 1 if self._force.is_set() else 0
            stopper.cancel()
            try:
                runner: web.AppRunner = startup.result()
            except (EngineConfigError, OSError, InsecureBindError, KeyFileError, TlsError,
                    ClusterKeyError, StoreError, TracingUnavailable) as exc:  # expected
                log.error("startup_failed", error=str(exc), error_type=type(exc).__name__)
                return 1
            except Exception as exc:  # noqa: BLE001 - a bug or an engine failure: keep the traceback
                log.exception("startup_failed", error=str(exc), error_type=type(exc).__name__)
                return 1
            watchdog = asyncio.ensure_future(self._notifier.watchdog_loop())
            stack.callback(watchdog.cancel)
            await self._stop.wait()
            await self._drain(runner)
        log.info("stopped", forced=self._force.is_set())
        return 1 if self._force.is_set() else 0

    async def _startup(self, stack: contextlib.AsyncExitStack) -> web.AppRunner:
        cfg = self.config
        # Issue 4, before any engine or socket: no open server on a reachable address by accident, and
        # a bad keys file fails the start naming the file.
        check_auth_binding(cfg.auth, cfg.server.host)
        check_tls_binding(cfg.server.tls, cfg.server.host, cfg.server.allow_plaintext_non_loopback)
        if cfg.server.tls is not None:   # a certificate that does not load fails the start, naming the key
            self.tls = await ListenerTls.start(cfg.server.tls)
        # Bound now, before engines take minutes to load: a port in use fails the start at once.
        sock = bind_listener(cfg.server.host, cfg.server.port)
        stack.callback(sock.close)
        self.host, self.port = sock.getsockname()[:2]
        store = await open_store(stack, cfg)     # a corrupt or locked database fails the start, naming it
        tenancy = await asyncio.to_thread(Tenancy, cfg)
        for name, model in cfg.models.items():
            kind = missing_synthetic(name, model, cfg.server)
            if kind is not None:
                await build_synthetic_artifact(Path(cfg.server.engines_root), name, kind, self._notifier)
        state = await self._load_versions(stack)
        state.tenancy = tenancy
        if store is not None:
            ledger = Ledger(store, unavailable_retry_s=cfg.store.unavailable_retry_s)
            state.store, state.ledger, state.idempotency = store, ledger, IdempotencyStore(store)
            state.transcripts = Transcripts(store)
        tenancy.start(state.engines, audit=state.control.audit)  # queue per engine; keys-file poll, audited
        stack.push_async_callback(tenancy.close)  # unwinds before the engines close
        app = self._app_factory(state)
        # handler_cancellation: a client that goes away cancels its handler, which aborts its request.
        # GuardedRunner (inferd.daemon.listener): read deadlines, idle timeout and the connection cap,
        # from the live [server] table (a reload applies to new connections).
        runner = GuardedRunner(app, settings=lambda: state.config.server, metrics=state.metrics,
                               handle_signals=False, access_log=None, handler_cancellation=True,
                               shutdown_timeout=HANDLER_SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.SockSite(runner, sock, ssl_context=self.tls.context if self.tls is not None else None)
        await site.start()
        self.host, self.port = runner.addresses[0][:2]
        # After the listener: the batch runner posts to it, peers forward requests to its address.
        await start_services(stack, state, self.host, self.port, self.tls is not None, run_batches=self._run_batches)
        state.started = True
        log.info("listening", host=self.host, port=self.port, tls=self.tls is not None)
        log.info("ready", models=list(state.engines),
                 versions=[str(k) for k in state.registry.table.versions], refused=list(state.versions.failures))
        self._notifier.ready(self._status())
        self.ready.set()
        return runner

    async def _load_versions(self, stack: contextlib.AsyncExitStack) -> ServerState:
        """Every configured version, verified and warmed; the routing control plane over them."""
        cfg = self.config
        registry = ModelRegistry()
        state = ServerState(cfg, {})
        if cfg.tracing is not None:       # spans leave from the SDK's thread; what is queued goes out at exit
            t = cfg.tracing
            state.tracing = Tracing(endpoint=t.endpoint, service_name=t.service_name, sample_ratio=t.sample_ratio,
                                    headers=t.headers, timeout_s=t.timeout_s)
            stack.push_async_callback(asyncio.to_thread, state.tracing.shutdown)
        versions = VersionManager(registry, cfg.server, self._engine_factory)
        versions.step_observer = self._observe_steps(state)
        control = ControlPlane(cfg, registry)
        stack.callback(control.close)     # last out: the audit log sees every record before it closes
        stack.push_async_callback(versions.close_all)
        lifecycle = None
        if cfg.server.model_memory_bytes is None:       # every version now, for good
            await versions.load_all(version_specs(cfg))
            if not registry.table.versions:
                first = next(iter(versions.failures.values()), "no models configured")
                raise EngineConfigError(next(iter(cfg.models), "?"), first.partition(": ")[2] or first)
        else:       # a memory budget (issue 17): cold until asked for, except pinned and prewarmed ones
            lifecycle = ModelLifecycle(versions, cfg, audit=control.audit,
                                       active_rollout_versions=control.rollouts.active_versions,
                                       on_change=lambda: routes_changed(state), on_unloaded=unloaded_hook(state))
            await lifecycle.configure(cfg)
            state.lifecycle = lifecycle
        defaults = versions.defaults(cfg)
        registry.configure(defaults=defaults, aliases=routes_from_config(cfg, defaults))
        control.configure_rollouts(cfg)
        control.start_on_load(cfg)
        state.registry, state.versions, state.control = registry, versions, control
        state.shadows = shadows = ShadowDispatcher(control.shadows)
        stack.push_async_callback(shadows.close)
        state.engines = versions.default_engines(registry.table.defaults)
        self.state, self.control = state, control
        self.reloader = Reloader(state, control, versions, tls=self.tls)
        if lifecycle is not None:
            await lifecycle.start()
            schedule = asyncio.ensure_future(run_prewarm_schedule(lifecycle))     # [models.X] prewarm_at
            stack.callback(schedule.cancel)
        ticker = asyncio.ensure_future(control.tick_loop())
        stack.callback(ticker.cancel)
        return state

    @staticmethod
    def _observe_steps(state: ServerState) -> Callable[[str, Engine], None]:
        def hook(name: str, engine: Engine) -> None:
            # Pass the engine: at startup state.engines is still empty, so the name alone labels "other".
            state.metrics.observe_engine(name, engine)
        return hook

    async def _drain(self, runner: web.AppRunner) -> None:
        state = self.state
        if state is None:  # _drain runs only after a successful startup, which sets it
            return
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
        drained = await self._wait_drained(state)
        if not drained:
            log.warning("drain_incomplete", in_flight=state.in_flight, forced=self._force.is_set())
        for site in list(runner.sites):
            await site.stop()                  # now stop accepting connections
        # Requests still queued in admission get 503 `draining`; then close engines before the runner:
        # their open streams end with finish_reason "abort", so handlers still streaming send a final
        # chunk and return instead of being cancelled.
        await state.tenancy.close()
        if state.shadows is not None:
            await state.shadows.close()
        if state.versions is not None:
            if self._force.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(state.versions.close_all(), FORCED_CLOSE_TIMEOUT_S)
            else:
                await state.versions.close_all()
        if self._force.is_set() and runner.server is not None:
            # Cancel whatever handler is left now rather than after HANDLER_SHUTDOWN_TIMEOUT_S.
            # (aiohttp reads a timeout of 0 as "no timeout", hence a small positive one.)
            await runner.server.shutdown(0.01)

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
