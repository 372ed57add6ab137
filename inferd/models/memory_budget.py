"""Model versions under a node's memory budget: loaded when asked for, evicted when idle.

Only with `[server] model_memory_bytes`; without it every configured version loads at start and stays
(VersionManager alone). With it, each configured version is registered `cold` with its footprint
(inferd.models.footprint, estimated off the loop), and:

- at start, `pinned` versions load (they never leave), then `prewarm` ones while they fit;
- a request for a cold version (`ensure`) starts its load, or joins the one under way: concurrent
  requests share one load. Loads run one at a time (the device lock; one device per node for now), off
  the event loop as VersionManager does them (verify and warm in threads). When a load's turn comes,
  the policy (inferd.models.residency) names the least recently used idle versions to evict, or says
  there is no room. When only requests in flight stand in the way, the load waits for one to end (up
  to BUSY_WAIT_S); otherwise (versions used too recently, pinned ones) every request waiting for that
  load gets 503 `no_room_for_model` with the policy's Retry-After, never a wait on an estimate that
  the next request on a hot model can push back;
- a request waits only when the load's estimated end (measured load times, else the footprint at
  ~1 GB/s; the sim's own load time) fits its deadline; otherwise 503 `model_loading` with that estimate
  as Retry-After, and the load goes on, so the retry finds the model hot;
- a load that fails (a corrupt artifact, an engine that does not start) leaves the others serving and
  is answered 503 `model_load_failed` naming the reason, for FAILED_LOAD_COOLDOWN_S before it is tried
  again;
- evicting a version stops routing to it in the same synchronous step as the decision (no request can
  start on it after), then unloads it; `unload` (the admin route) drains its requests first.

Which versions are loaded, and which configured version each was loaded as, is the registry's table
(inferd.models.registry); this asks it, and keeps only the budget's own account (Residency: bytes, use,
pins, per configured version). VersionManager tells it when a version it retired has unloaded.

Versions in an active rollout count as pinned. Every load, failure and eviction is audited
(`model.load`, `model.load_failed`, `model.evict`, `model.unload`) and counted for /metrics.
"""
from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from inferd.config import Config
from inferd.models.footprint import FootprintError, artifact_dir, estimate_bytes, measured_bytes
from inferd.models.memory_budget_types import Histogram, LifecycleError
from inferd.models.load_times import LoadTimes
from inferd.models.residency import COLD, DRAINING, HOT, LoadPlan, NeverFits, Residency
from inferd.models.routing import SpecKey
from inferd.models.specs import VersionSpec, version_specs
from inferd.models.versions import VersionManager
from inferd.observability import SYSTEM_ACTOR, get_logger
from inferd.types import ModelVersion

log = get_logger("inferd.lifecycle")

FAILED_LOAD_COOLDOWN_S = 30.0
UNKNOWN_RETRY_S = 5.0                    # Retry-After when nothing will be evictable at a known time
BUSY_WAIT_S = 30.0                       # a load waits this long for requests in flight to end
LOADED_HOLD_S = 1.0                      # a version just loaded is not evicted before its waiters route to it
LOAD_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
WAIT_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


class ModelLifecycle:
    def __init__(self, versions: VersionManager, config: Config, *, audit: Any,
                 active_rollout_versions: Callable[[], set[ModelVersion]] = set,
                 on_change: Callable[[], None] = lambda: None,
                 on_unloaded: Callable[[ModelVersion, Any], Awaitable[None]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`on_change`: a version became routable or stopped being (refresh the routes); `on_unloaded(mv,
        engine)`: a version is gone (close its admission queue, forget its breaker)."""
        server = config.server
        self.versions = versions
        self.registry = versions.registry
        self.config = config
        self.audit = audit
        self._rollout_versions = active_rollout_versions
        self._on_change = on_change
        self._on_unloaded = on_unloaded
        self.clock = clock
        self._loading_specs: dict[SpecKey, VersionSpec] = {}   # as they were when their load started
        self.residency = Residency(server.model_memory_bytes or 0, server.min_residency_s, clock=clock)
        self.specs: dict[SpecKey, VersionSpec] = {}
        self._loads: dict[SpecKey, asyncio.Task] = {}
        self._queue: list[SpecKey] = []               # loads waiting for the device, in order
        self.times = LoadTimes(clock)                 # loads under way, measured load times: estimates
        self._device = asyncio.Lock()
        self._released = asyncio.Event()              # a request on a loaded version ended
        self._failed: dict[SpecKey, tuple[float, str]] = {}   # until, why
        self.load_seconds = Histogram(LOAD_BUCKETS)
        self.cold_waits = Histogram(WAIT_BUCKETS)
        self.loads: dict[str, int] = {}               # result -> n
        self.evictions: dict[str, int] = {}           # reason -> n
        versions.usage_observer = self._used
        versions.unloaded_observer = self._unloaded

    # -- configuration ------------------------------------------------------------------------
    async def configure(self, config: Config) -> None:
        """Register every version of `config` (footprints estimated off the loop); forget cold ones it
        no longer lists (loaded ones are retired by the reload, and forgotten once unloaded)."""
        self.config = config
        self.residency.budget_bytes = config.server.model_memory_bytes or 0
        self.residency.min_residency_s = config.server.min_residency_s
        specs = {(s.model, s.requested): s for s in version_specs(config)}
        sizes = await asyncio.to_thread(self._estimates, list(specs.values()))
        for key, spec in specs.items():
            self.residency.register(key, sizes[key], pinned=spec.config.pinned)
        for key in [k for k in self.specs if k not in specs]:
            if self.residency.state(key) == COLD and key not in self._loads:     # else: when it unloads
                del self.residency.versions[key]
        self.specs = specs

    def _estimates(self, specs: Iterable[VersionSpec]) -> dict[SpecKey, int]:
        out = {}
        for s in specs:
            try:
                path = artifact_dir(s.model, s.config, self.config.server, s.requested)
                out[(s.model, s.requested)] = estimate_bytes(s.model, s.config, self.config.server, path)
            except (FootprintError, OSError, ValueError) as exc:
                # Loading it will fail the same way and say so; meanwhile it cannot take the whole budget.
                log.warning("footprint_unknown", model=s.model, version=s.requested, error=str(exc))
                out[(s.model, s.requested)] = 0
        return out

    async def start(self) -> None:
        """Pinned versions load now (they never leave), then prewarmed ones while they fit."""
        for pinned in (True, False):
            for key, spec in self.specs.items():
                if spec.config.pinned == pinned and (pinned or spec.config.prewarm):
                    try:
                        await self.ensure(key, self.clock() + self.config.server.request_timeout_s, evict=pinned,
                                          reason="pinned" if pinned else "prewarm")
                    except LifecycleError as exc:
                        log.error("prewarm_failed", model=key[0], version=key[1], error=str(exc))

    # -- requests ------------------------------------------------------------------------------
    def spec_key(self, name: str) -> SpecKey | None:
        """`model` (its default version) or `model@version` (a configured or loaded version id)."""
        model, _, version = name.partition("@")
        if not version:
            m = self.config.models.get(model)
            return (model, m.version) if m is not None else None
        loaded_now = self.registry.loaded()
        for key in self.specs:
            loaded = loaded_now.get(key)
            if key[0] == model and (key[1] == version or (loaded is not None and loaded.version == version)):
                return key
        return None

    def key_for(self, model_field: str, table: Any, tenant: str = "", priority: str | None = None) -> SpecKey | None:
        """The configured version a request's `model` asks for, when it is not hot (None: hot, or not a
        version this lifecycle manages; routing then answers as it always does). An alias's precision tier
        for `tenant` or its `priority` class asks for the tier's versions: they load on demand like any."""
        base = model_field.partition(":")[0].removesuffix("+simulated")
        if "@" in base or base in self.config.models:
            key = self.spec_key(base)
            return self._unless_hot(key) if key is not None else None
        split = table.split_for(base) if base in table.aliases else None
        if split is not None:
            rule = split.tier_rule(tenant, priority)
            arms = rule.arms if rule is not None else split.arms
            if any(table.is_ready(a.target) for a in arms if a.weight > 0):
                return None
            arm = max(arms, key=lambda a: a.weight).target
            return self.key_for(f"{arm.model}@{arm.version}", table)
        return None

    def loading_here(self, key: SpecKey) -> bool:
        """A load of `key` is under way or queued on this node."""
        return key in self._loads

    def _unless_hot(self, key: SpecKey) -> SpecKey | None:
        return None if key not in self.residency.versions or self._hot(key) else key

    def _hot(self, key: SpecKey) -> bool:
        """`key` is served now: hot itself, or its version is loaded under another key ("latest" and its id)."""
        if self.residency.state(key) == HOT:
            return True
        mv = self.registry.serving(key)
        same = self.registry.loaded_as(mv) if mv is not None else None
        return (same is not None and same != key and same in self.residency.versions
                and self.residency.state(same) == HOT)

    async def ensure(self, key: SpecKey, deadline: float, *, evict: bool = True, reason: str = "request",
                     actor: str = SYSTEM_ACTOR) -> None:
        """Return once `key` is hot; or LifecycleError: it cannot be by `deadline` (time.monotonic)."""
        waited_from = self.clock()
        while not self._hot(key):
            if self.residency.state(key) == DRAINING:
                raise LifecycleError(f"The model `{key[0]}` is being unloaded; retry in a moment.",
                                     "model_unloading", 1.0)
            task = self._loads.get(key) or self._start_load(key, evict, reason, actor)
            ready_in = self._ready_in(key)
            if self.clock() + ready_in > deadline:
                raise LifecycleError(f"The model `{key[0]}` is loading; it should be ready in about "
                                     f"{math.ceil(ready_in)} s.", "model_loading", ready_in)
            try:
                await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - self.clock()))
            except asyncio.TimeoutError:
                raise LifecycleError(f"The model `{key[0]}` is still loading.", "model_loading",
                                     self._ready_in(key)) from None
        if reason == "request":
            self.cold_waits.observe(self.clock() - waited_from)

    def _start_load(self, key: SpecKey, evict: bool, reason: str, actor: str) -> asyncio.Task:
        failed = self._failed.get(key)
        if failed is not None and self.clock() < failed[0]:
            raise LifecycleError(f"The model `{key[0]}` failed to load: {failed[1]}", "model_load_failed",
                                 failed[0] - self.clock())
        if not self._device.locked() and not self._queue:
            try:
                self._plan(key, evict)      # refused now (no room, never fits) rather than after queueing
            except LifecycleError as exc:
                if not exc.busy:            # busy: requests in flight will end, and the load waits for that
                    raise
        self._queue.append(key)
        self._loading_specs[key] = self.specs[key]
        # A fresh context: the load is the node's, not the request's that started it (its log lines, its id).
        loop = asyncio.get_running_loop()
        task = contextvars.Context().run(loop.create_task, self._load(key, evict, reason, actor),
                                         name=f"load-{key[0]}")
        self._loads[key] = task
        task.add_done_callback(lambda t, k=key: self._loaded(k, t))
        return task

    def _loaded(self, key: SpecKey, task: asyncio.Task) -> None:
        self._loads.pop(key, None)
        self._loading_specs.pop(key, None)
        if key not in self.specs and key in self.residency.versions and self.residency.state(key) == COLD:
            del self.residency.versions[key]        # a reload dropped it while it loaded
        if key in self._queue:
            self._queue.remove(key)
        if not task.cancelled():
            task.exception()                # retrieved: waiters have their own copy; none may be left

    def _refresh_pins(self) -> None:
        """Pinned: configured so, or a version of a rollout under way (it stays while the rollout runs)."""
        in_rollouts = {self.registry.loaded_as(mv) for mv in self._rollout_versions()}
        for k, r in self.residency.versions.items():
            spec = self.specs.get(k)
            r.pinned = k in in_rollouts or (spec is not None and spec.config.pinned)

    def _plan(self, key: SpecKey, evict: bool) -> LoadPlan:
        self._refresh_pins()
        try:
            plan = self.residency.plan_load(key)
        except NeverFits as exc:
            raise LifecycleError(f"The model `{key[0]}` does not fit this node's memory budget: {exc}.",
                                 "model_does_not_fit") from None
        if isinstance(plan, LoadPlan) and (evict or not plan.evict):
            return plan
        retry = plan.retry_after_s if not isinstance(plan, LoadPlan) else math.inf
        retry = UNKNOWN_RETRY_S if math.isinf(retry) else max(1.0, retry)
        err = LifecycleError(f"No room to load the model `{key[0]}`: the models loaded here are in use; "
                             f"retry after {math.ceil(retry)} s or on another node.", "no_room_for_model", retry)
        err.busy = evict and not isinstance(plan, LoadPlan) and plan.reason == "in_flight"
        raise err

    async def _room(self, key: SpecKey, evict: bool) -> LoadPlan:
        """The plan for `key`'s load; while every version that could make room is serving requests, wait
        for one of them to end (up to BUSY_WAIT_S), then plan again."""
        give_up = self.clock() + BUSY_WAIT_S
        while True:
            try:
                return self._plan(key, evict)
            except LifecycleError as exc:
                if not exc.busy or self.clock() >= give_up:
                    raise
            self._released.clear()
            try:
                await asyncio.wait_for(self._released.wait(), max(0.0, give_up - self.clock()))
            except asyncio.TimeoutError:
                pass

    async def _load(self, key: SpecKey, evict: bool, reason: str, actor: str) -> None:
        spec = self._loading_specs[key]
        async with self._device:
            self._queue.remove(key)
            if key not in self.specs:
                raise LifecycleError(f"`{key[0]}@{key[1]}` is no longer configured here.", "model_not_configured")
            if self.residency.state(key) != COLD:   # unloading still (an admin's drain): not a load's to touch
                raise LifecycleError(f"The model `{key[0]}` is being unloaded; retry in a moment.",
                                     "model_unloading", 1.0)
            plan = await self._room(key, evict)
            victims = list(plan.evict)
            gone = [self._stop(v) for v in victims]     # synchronous with the decision: no request starts on them
            for victim, mv in zip(victims, gone):
                await self._unload(victim, mv, "lru", SYSTEM_ACTOR)
            self.residency.loading(key)
            t0 = self.times.started(key)
            try:
                mv = await self.versions.load(spec, lambda engine: self.residency.warming(key, measured_bytes(engine)))
            except Exception as exc:  # noqa: BLE001 - e.g. the daemon closing every engine under it
                log.error("model_load_error", model=key[0], version=key[1], error=str(exc))
                mv = None
            finally:
                self.times.ended(key, None)
            seconds = self.clock() - t0
            if mv is None:
                self._failed_load(key, spec, reason, actor)
            self._failed.pop(key, None)
            other = self.registry.loaded_as(mv)
            if other is not None and other != key:      # "latest" resolved to a version loaded as its id
                self.residency.failed(key)              # one engine, counted once: under `other`
                self._on_change()
                return
            self.residency.hot(key)
            if key not in self.specs:               # a reload dropped it while it loaded: it goes at once
                await self._unload(key, self._stop(key), "config", SYSTEM_ACTOR)
                raise LifecycleError(f"`{key[0]}@{key[1]}` is no longer configured here.", "model_not_configured")
            self._hold(key)
            self.times.ended(key, seconds)
            self.load_seconds.observe(seconds)
            self._count(self.loads, "success")
            self._on_change()
            self.audit.append(actor, "model.load", target=str(mv), reason=reason,
                              detail={"seconds": round(seconds, 3), "bytes": self.residency.versions[key].footprint,
                                      "evicted": [str(m) for m in gone]})
            log.info("model_loaded", model=key[0], version=mv.version, reason=reason, seconds=round(seconds, 3),
                     evicted=[str(m) for m in gone])

    def _failed_load(self, key: SpecKey, spec: VersionSpec, reason: str, actor: str) -> None:
        self.residency.failed(key)          # from loading or warming
        why = self.versions.failures.get(spec.label, "unknown error")
        self._failed[key] = (self.clock() + FAILED_LOAD_COOLDOWN_S, why)
        self._count(self.loads, "failed")
        self.audit.append(actor, "model.load_failed", target=f"{key[0]}@{key[1]}", reason=reason,
                          detail={"error": why})
        raise LifecycleError(f"The model `{key[0]}` failed to load: {why}", "model_load_failed",
                             FAILED_LOAD_COOLDOWN_S)

    def _hold(self, key: SpecKey) -> None:
        """Keep a version just loaded from eviction for LOADED_HOLD_S: the requests that waited for it resume
        a loop turn or two later, and the next load (plain LRU: min_residency_s = 0) must not take it first."""
        self.residency.hold(key)

        def let_go() -> None:
            r = self.residency.versions.get(key)
            if r is not None and r.in_flight > 0:
                self.residency.hold(key, False)
                self._released.set()
        asyncio.get_running_loop().call_later(LOADED_HOLD_S, let_go)

    def _ready_in(self, key: SpecKey) -> float:
        """Seconds until `key`'s load (under way or queued) should be done."""
        return self.times.ready_in(key, self._queue, self._estimate_s)

    def _estimate_s(self, key: SpecKey) -> float:
        spec = self._loading_specs.get(key) or self.specs[key]
        return self.times.estimate(key, spec.config, self.residency.versions[key].footprint)

    # -- evictions -------------------------------------------------------------------------------
    def _stop(self, key: SpecKey) -> ModelVersion | None:
        self.residency.evicting(key)
        mv = self.registry.serving(key)
        if mv is not None:
            self.versions.stop_routing(mv)
        return mv

    async def _unload(self, key: SpecKey, mv: ModelVersion | None, reason: str, actor: str) -> None:
        if mv is not None:
            engine = self.registry.table.engine(mv)
            await self.versions.unload_when_idle(mv)    # its bytes are freed there (_unloaded)
            if self._on_unloaded is not None:
                await self._on_unloaded(mv, engine)
        if key in self.residency.versions and self.residency.state(key) != COLD:
            self.residency.unloaded(key)
        self._released.set()                # a load waiting for room plans again
        self._count(self.evictions, reason)
        self._on_change()
        self.audit.append(actor, "model.evict" if reason == "lru" else "model.unload",
                          target=str(mv) if mv else f"{key[0]}@{key[1]}", reason=reason)
        log.info("model_unloaded", model=key[0], version=mv.version if mv else key[1], reason=reason)

    async def unload(self, key: SpecKey, actor: str) -> None:
        """The admin's unload: refused for pinned and loading versions; drains in-flight requests first."""
        self._refresh_pins()
        r = self.residency.versions[key]
        if r.pinned:
            raise LifecycleError(f"`{key[0]}@{key[1]}` is pinned (or in a rollout) and is never unloaded.",
                                 "model_pinned", status=409)
        if r.state != HOT:
            raise LifecycleError(f"`{key[0]}@{key[1]}` is {r.state}, not loaded.", f"model_{r.state}", status=409)
        await self._unload(key, self._stop(key), "admin", actor)

    # -- use -------------------------------------------------------------------------------------
    def _used(self, mv: ModelVersion, delta: int) -> None:
        key = self.registry.loaded_as(mv)
        r = self.residency.versions.get(key) if key is not None else None
        if r is not None and r.state != COLD:
            if delta > 0:
                self.residency.acquire(key)
            else:
                self.residency.release(key)
                self._released.set()

    def retiring(self, mv: ModelVersion) -> None:
        """A reload stopped routing to `mv`: it still holds its bytes until it unloads, but may not be evicted."""
        key = self.registry.loaded_as(mv)
        if key is not None and key in self.residency.versions and self.residency.state(key) == HOT:
            self.residency.evicting(key)

    def _unloaded(self, mv: ModelVersion, key: SpecKey | None) -> None:
        """VersionManager unloaded `mv` (loaded as `key`; an eviction here, or a version a reload retired) and
        closed its engine: its bytes are free; forgotten if the config dropped it."""
        if key is None or key not in self.residency.versions:
            return
        if self.residency.state(key) in (HOT, DRAINING):
            self.residency.unloaded(key)
            self._released.set()
        if key not in self.specs:
            del self.residency.versions[key]

    @staticmethod
    def _count(counts: dict[str, int], label: str) -> None:
        counts[label] = counts.get(label, 0) + 1

    def residency_of(self, model: str) -> str | None:
        """The state of `model`'s default version (None: not a configured model)."""
        m = self.config.models.get(model)
        r = self.residency.versions.get((model, m.version)) if m is not None else None
        return r.state if r is not None else None

    def snapshot(self) -> dict:
        """Per configured version: state, bytes, pinned; the budget and what it holds (readyz, metrics)."""
        versions = {}
        loaded = self.registry.loaded()
        for key, r in self.residency.versions.items():
            mv = loaded.get(key)
            versions[f"{key[0]}@{key[1]}"] = {
                "model": key[0], "configured": key[1], "version": mv.version if mv else key[1], "state": r.state,
                "bytes": r.footprint, "pinned": r.pinned, "in_flight": r.in_flight}
        return {"budget_bytes": self.residency.budget_bytes, "used_bytes": self.residency.used_bytes(),
                "versions": versions}

