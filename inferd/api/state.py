"""What the HTTP app reads of the running daemon: config, engines, readiness, in-flight work.

The daemon owns one ServerState. A reload (issue 5) builds new objects and swaps these attributes
wholesale; nothing here mutates a Config. Handlers wrap each request in `state.track()` so a drain
can wait for the in-flight count to reach zero on an event rather than polling it.
"""
from __future__ import annotations

import asyncio
import socket
import time
from types import TracebackType

from inferd.api.pipeline.internal import new_secret
from inferd.cache import ResponseCache
from inferd.cluster import Cluster
from inferd.config import Config
from inferd.engine import Engine
from inferd.models import (ControlPlane, ModelLifecycle, ModelRegistry, ShadowDispatcher, VersionManager,
                           registry_from_engines)
from inferd.observability import Metrics, Tracing
from inferd.safety import Policies
from inferd.slo import SloTracker
from inferd.store import Database, IdempotencyStore, Ledger, Transcripts
from inferd.tenancy import Tenancy

HOST = socket.gethostname()


class _Tracked:
    """`with state.track():` / `async with state.track():` counts one in-flight request."""

    __slots__ = ("_state", "_entered")

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._entered = False

    def __enter__(self) -> _Tracked:
        self._state._begin()
        self._entered = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._entered:
            self._entered = False
            self._state._end()

    async def __aenter__(self) -> _Tracked:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


class ServerState:
    """The daemon's live objects, as the API sees them. Event-loop thread only."""

    def __init__(self, config: Config, engines: dict[str, Engine], metrics: Metrics | None = None) -> None:
        self.config = config
        self.engines = engines
        self.metrics = metrics if metrics is not None else Metrics(lambda: self.engines)
        self.draining = False
        self.started = False          # set by the daemon once every engine is started and warmed
        self.started_at = time.time()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # Issue 5 (inferd.models.versions / inferd.models.control): the daemon sets these; an embedder that only
        # passes `engines` gets a registry serving one version per model on first use.
        self._registry: ModelRegistry | None = None
        self.versions: VersionManager | None = None      # acquire/release, load failures
        self.control: ControlPlane | None = None         # rollouts, shadow stats, audit
        self.shadows: ShadowDispatcher | None = None
        self.lifecycle: ModelLifecycle | None = None     # issue 17: with [server] model_memory_bytes only
        self.metrics.watch_lifecycle(lambda: self.lifecycle)
        # Issue 4 (inferd.tenancy.node): keys, tenants, quota, one admission queue per engine. The daemon sets
        # it (reading the keys file at startup); an embedder gets one built from `config` on first use.
        self._tenancy: Tenancy | None = None
        self.metrics.watch_tenancy(lambda: self._tenancy)
        # Issue 11 (inferd.cluster): set by the daemon when the config has a [cluster] table.
        self.cluster: Cluster | None = None
        self.metrics.watch_cluster(lambda: self.cluster)
        # Issue 12 (inferd.store): the daemon opens the store; without one (an embedder's app, tests of
        # other layers) nothing is recorded and Idempotency-Key is refused.
        self.store: Database | None = None
        self.ledger: Ledger | None = None
        self.idempotency: IdempotencyStore | None = None
        self.transcripts: Transcripts | None = None     # issue 15: text kept for tenants with a retention period
        self.transcript_writes: set = set()             # their background writes (inferd.api.pipeline.transcripts)
        self.metrics.watch_store(lambda: self.store)
        # The Batch API's runner authenticates its own requests with this (inferd.api.pipeline.internal).
        self.batch_secret = new_secret()
        # Running BatchRunners (inferd.jobs.batch_runner), woken when a batch is created or cancelled.
        self.batch_runners: set = set()
        # Issue 14 (inferd.slo): finished requests judged against [slos.*]; a reload reconfigures it.
        self.slos = SloTracker(config.slos)
        self.metrics.watch_slos(lambda: self.slos)
        self.metrics.watch_breakers(lambda: self.control.breakers if self.control is not None else None)
        # Issue 14: OpenTelemetry spans per request stage; the daemon sets it when [tracing] is configured.
        self.tracing: Tracing | None = None
        # Issue 15 (inferd.safety): the tenants' content policies; a reload builds new ones.
        self.safety = Policies(config.policies, lambda tenant: self.tenancy.tenants.get(tenant))
        self.response_cache = ResponseCache(config.cache.max_bytes, config.cache.ttl_s)   # used by opted-in tenants
        self.metrics.watch_response_cache(lambda: self.response_cache)

    @property
    def node_name(self) -> str:
        """This node in ledger rows: its cluster node id, else the host name."""
        return self.cluster.node_id if self.cluster is not None else HOST

    @property
    def tenancy(self) -> Tenancy:
        """Authenticator, tenant registry, quota, admission queues (inferd.tenancy)."""
        if self._tenancy is None:
            self._tenancy = Tenancy(self.config)
        return self._tenancy

    @tenancy.setter
    def tenancy(self, tenancy: Tenancy) -> None:
        self._tenancy = tenancy

    @property
    def registry(self) -> ModelRegistry:
        """The ModelRegistry routing requests to loaded engine versions."""
        if self._registry is None:
            self._registry = registry_from_engines(self.engines)
        return self._registry

    @registry.setter
    def registry(self, registry: ModelRegistry) -> None:
        self._registry = registry

    # -- readiness -------------------------------------------------------------------------
    def ready(self) -> bool:
        """Serving: every engine started, warmed and healthy, not draining, and the usage ledger not
        failing (readyz)."""
        # Under a memory budget (issue 17) a node with every model cold still serves: they load when asked for.
        if not self.started or self.draining or (not self.engines and self.lifecycle is None) or self.ledger_failing():
            return False
        return all(engine.healthy for engine in self.engines.values())

    def ledger_failing(self) -> bool:
        """The ledger's last commit failed for the store's sake, and requests are refused for now."""
        return self.ledger is not None and self.ledger.unavailable_for() > 0

    # -- in-flight requests ----------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self._in_flight

    def track(self) -> _Tracked:
        """Count a request as in flight for the duration of a with-block."""
        return _Tracked(self)

    def _begin(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def _end(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no request is in flight. False if `timeout` passed first."""
        if self._in_flight == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True
