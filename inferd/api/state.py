"""What the HTTP app reads of the running daemon: config, engines, readiness, in-flight work.

The daemon owns one ServerState, built whole by inferd.api.build_state (tests build theirs the same
way). A reload builds new objects and swaps these attributes wholesale; nothing here mutates a Config.
Handlers wrap each request in `state.track()` so a drain can wait for the in-flight count to reach
zero on an event rather than polling it.
"""
from __future__ import annotations

import asyncio
import socket
import time
from types import TracebackType
from typing import NamedTuple

from inferd.api.pipeline.internal import new_secret
from inferd.cache import ResponseCache
from inferd.cluster import Cluster
from inferd.config import Config, StoreConfig
from inferd.engine import Engine
from inferd.models import ControlPlane, ModelLifecycle, ModelRegistry, ShadowDispatcher, VersionManager
from inferd.observability import Metrics, Tracing
from inferd.safety import Policies
from inferd.slo import SloTracker
from inferd.store import Database, IdempotencyStore, Ledger, ResponseStore, Transcripts
from inferd.tenancy import Tenancy
from inferd.types import ModelVersion

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


class StoreServices(NamedTuple):
    """The durable store and what records into it: present together (a configured [store]) or not at all."""

    database: Database
    ledger: Ledger
    idempotency: IdempotencyStore
    transcripts: Transcripts      # text kept for tenants with a retention period
    responses: ResponseStore      # the Responses API's stored responses (`store`)

    @classmethod
    def over(cls, database: Database, config: StoreConfig) -> StoreServices:
        return cls(database, Ledger(database, unavailable_retry_s=config.unavailable_retry_s),
                   IdempotencyStore(database), Transcripts(database), ResponseStore(database))


class ServerState:
    """The daemon's live objects, as the API sees them. Event-loop thread only. Build one with
    inferd.api.build_state; a reload swaps `config` (and what is built from it) wholesale.

    Optional features are None when not configured: `storage` ([store] with a state directory: without
    it nothing is recorded and Idempotency-Key is refused), `cluster` ([cluster]), `tracing` ([tracing])
    and `lifecycle` (the model lifecycle under [server] model_memory_bytes)."""

    def __init__(self, config: Config, engines: dict[str, Engine], *, tenancy: Tenancy, registry: ModelRegistry,
                 versions: VersionManager, control: ControlPlane, shadows: ShadowDispatcher,
                 storage: StoreServices | None = None, cluster: Cluster | None = None,
                 tracing: Tracing | None = None, lifecycle: ModelLifecycle | None = None) -> None:
        self.config = config
        self.engines = engines        # served model name -> its default version's engine
        self.tenancy = tenancy        # keys, tenants, quota, one admission queue per engine
        self.registry = registry      # routes requests to loaded engine versions
        self.versions = versions      # acquire/release, load failures
        self.control = control        # rollouts, breakers, shadow stats, audit
        self.shadows = shadows
        self.storage = storage
        self.cluster = cluster
        self.tracing = tracing        # OpenTelemetry spans per request stage
        self.lifecycle = lifecycle
        self.draining = False
        self.started = False          # set by the daemon once every engine is started and warmed
        self.started_at = time.time()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.transcript_writes: set = set()             # background transcript writes (inferd.api.pipeline.transcripts)
        # The Batch API's runner authenticates its own requests with this (inferd.api.pipeline.internal).
        self.batch_secret = new_secret()
        # Running BatchRunners (inferd.jobs.batch_runner), woken when a batch is created or cancelled.
        self.batch_runners: set = set()
        self.slos = SloTracker(config.slos)     # finished requests judged against [slos.*]
        self.safety = Policies(config.policies, lambda tenant: self.tenancy.tenants.get(tenant))
        self.response_cache = ResponseCache(config.cache.max_bytes, config.cache.ttl_s)   # used by opted-in tenants
        self.metrics = Metrics(lambda: self.engines)
        self._watch(self.metrics)

    def _watch(self, metrics: Metrics) -> None:
        metrics.watch_lifecycle(lambda: self.lifecycle)
        metrics.watch_tenancy(lambda: self.tenancy)
        metrics.watch_cluster(lambda: self.cluster)
        metrics.watch_store(lambda: self.store)
        metrics.watch_slos(lambda: self.slos)
        metrics.watch_breakers(lambda: self.control.breakers)
        metrics.watch_response_cache(lambda: self.response_cache)

    # -- the durable store's parts, by the names the request path reads ---------------------
    @property
    def store(self) -> Database | None:
        return self.storage.database if self.storage is not None else None

    @property
    def ledger(self) -> Ledger | None:
        return self.storage.ledger if self.storage is not None else None

    @property
    def idempotency(self) -> IdempotencyStore | None:
        return self.storage.idempotency if self.storage is not None else None

    @property
    def transcripts(self) -> Transcripts | None:
        return self.storage.transcripts if self.storage is not None else None

    @property
    def node_name(self) -> str:
        """This node in ledger rows: its cluster node id, else the host name."""
        return self.cluster.node_id if self.cluster is not None else HOST

    # -- loaded versions ---------------------------------------------------------------------
    def refresh_engines(self) -> None:
        """`engines` from the routing table's ready default versions."""
        self.engines = self.versions.default_engines(self.registry.table.defaults)

    def routes_changed(self) -> None:
        """A version was loaded or unloaded: the config's routes over what is loaded now."""
        control = self.control
        control.registry.swap(lambda t: control.final_table(t, self.config))
        control.start_on_load(self.config)
        self.refresh_engines()

    async def version_unloaded(self, key: ModelVersion, engine: Engine) -> None:
        """What goes with an unloaded version: its admission queue and its breaker."""
        self.control.breakers.forget(key)
        await self.tenancy.retire(engine)

    # -- readiness -------------------------------------------------------------------------
    def ready(self) -> bool:
        """Serving: every engine started, warmed and healthy, not draining, and the usage ledger not
        failing (readyz)."""
        # Under a memory budget a node with every model cold still serves: they load when asked for.
        if not self.started or self.draining or (not self.engines and self.lifecycle is None) or self.ledger_failing() \
                or self.store_failure() is not None:
            return False
        return all(engine.healthy for engine in self.engines.values())

    def store_failure(self) -> str | None:
        """Why the store is unavailable (a failed ping or write, until a ping succeeds); None when it answers."""
        store = self.store
        return None if store is None else store.health.failure

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
