"""SIGHUP: re-read the config and apply the difference without interrupting a stream.

1. Parse and validate the whole new file (off the loop), then re-read the keys file (off the loop).
   Invalid config or a malformed keys file: nothing changes (the old keys stay); the errors are
   logged, audited (`config.reload_failed`) and `inferd_config_reload_total{result="error"}` counts it.
2. Phase 1, one step on the loop: the new Config object (tenants, quotas, server timeouts) and
   the new routes and weights go live together in one routing-table swap. A route whose new
   targets are not loaded yet keeps its current split until they are (never a 503 gap).
3. New versions load and warm in the background (verified first; a failing one is refused alone).
4. Phase 2, one swap: the final routes, with every rollout's current weights re-applied on top
   (`RolloutManager.overlay`), so a reload never undoes a canary step or a rollback.
5. Versions no longer in the config are retired: no new requests from this instant; each closes
   when its last stream has finished (`VersionManager.retire`).

With `[server.tls]`, step 1 also loads the new certificate and key into a scratch context: one that
does not load refuses the whole reload like an invalid file. Just before phase 1 they go into the
listener's live context (inferd.daemon.tls): new handshakes get the new certificate, open connections
keep theirs.

With `[cluster]`, step 1 also re-reads the cluster key file (one that cannot be read refuses the
reload); the new key and settings apply with phase 1, the old key still accepted for key_grace_s.

Settings that need a restart (listen address, engines_root, TLS on or off, the client CA, a loaded
version's pool sizes, joining or leaving a cluster, the gossip address and node id, [store], a memory
budget turned on or off) are logged as such and otherwise left as they were.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TypeVar

import msgspec

from inferd.cluster import ClusterKeyError
from inferd.config import CLUSTER_RESTART_ONLY, Config, ConfigError, RoutingConfigError, TenantRegistry, load_config
from inferd.daemon.tls import RESTART_ONLY_TLS, ListenerTls, TlsError
from inferd.models import ControlPlane, VersionManager, version_specs
from inferd.observability import SYSTEM_ACTOR, get_logger
from inferd.safety import ClassifierError, Policies
from inferd.tenancy import KeyFileError, load_spend
from inferd.types import ModelVersion

log = get_logger("inferd.reload")

RESTART_ONLY = ("host", "port", "engines_root")
T = TypeVar("T", bound=msgspec.Struct)


class ReloadResult(msgspec.Struct, frozen=True):
    ok: bool
    errors: tuple[str, ...] = ()
    loaded: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()


async def read_config(path: str | Path, current: Config) -> Config:
    """The new file, validated; what needs a restart (the listen address, engines_root, TLS on or off,
    the client-certificate settings) stays as running, and is logged."""
    new = await asyncio.to_thread(load_config, path)
    server, kept = _as_running(new.server, current.server, RESTART_ONLY, "server")
    old_tls, new_tls = current.server.tls, server.tls
    if (old_tls is None) != (new_tls is None):
        server, kept = msgspec.structs.replace(server, tls=old_tls), [*kept, "server.tls"]
    elif old_tls is not None and new_tls is not None:
        tls, kept_tls = _as_running(new_tls, old_tls, RESTART_ONLY_TLS, "server.tls")
        server, kept = msgspec.structs.replace(server, tls=tls), kept + kept_tls
    if (current.server.model_memory_bytes is None) != (server.model_memory_bytes is None):
        # a memory budget on or off (issue 17) changes how every version loads: a restart; a new size applies now
        server = msgspec.structs.replace(server, model_memory_bytes=current.server.model_memory_bytes)
        kept = [*kept, "server.model_memory_bytes"]
    cluster = new.cluster
    if (current.cluster is None) != (cluster is None):      # joining or leaving a cluster: a restart
        cluster, kept = current.cluster, [*kept, "cluster"]
    elif cluster is not None and current.cluster is not None:
        cluster, kept_cluster = _as_running(cluster, current.cluster, CLUSTER_RESTART_ONLY, "cluster")
        kept += kept_cluster
    store = new.store
    if store != current.store:          # the database stays the one opened at start
        store, kept = current.store, [*kept, "store"]
    if kept:
        log.warning("reload_needs_restart", settings=kept,
                    message="these settings apply at the next restart; kept as running")
    return msgspec.structs.replace(new, server=server, cluster=cluster, store=store)


def _as_running(new: T, old: T, keys: tuple[str, ...], path: str) -> tuple[T, list[str]]:
    """`new` with `keys` put back to their running values, and the paths of those that differed."""
    changed = [k for k in keys if getattr(new, k) != getattr(old, k)]
    if changed:
        new = msgspec.structs.replace(new, **{k: getattr(old, k) for k in changed})
    return new, [f"{path}.{k}" for k in changed]


def _pool_changes(old: Config, new: Config, versions: VersionManager) -> list[str]:
    """Loaded versions whose backend or pool sizes changed: those apply to newly loaded versions only."""
    out = []
    for name, m in new.models.items():
        before = old.models.get(name)
        if before is None:
            continue
        strip = {"version": "", "versions": ()}
        if msgspec.structs.replace(m, **strip) != msgspec.structs.replace(before, **strip):
            if any(k[0] == name for k in versions.loaded):
                out.append(f"models.{name}")
    return out


class Reloader:
    """Applies reloads one at a time (a SIGHUP during a reload waits for it)."""

    def __init__(self, state, control: ControlPlane, versions: VersionManager,
                 tls: ListenerTls | None = None) -> None:
        self.state = state
        self.control = control
        self.versions = versions
        self.tls = tls              # the listener's live TLS context; None when serving plain HTTP
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()

    async def reload(self, path: str | Path) -> ReloadResult:
        async with self._lock:
            t0 = time.monotonic()
            state = self.state
            try:
                new = await read_config(path, state.config)
                self._check_routes(new)
                tenancy = getattr(state, "tenancy", None)
                authenticator = await tenancy.check_keys(new) if tenancy is not None else None
                cluster = getattr(state, "cluster", None)
                cluster_key = await cluster.read_key(new.cluster) if cluster is not None else None
                safety = Policies(new.policies, lambda tenant: state.tenancy.tenants.get(tenant))
                if self.tls is not None and new.server.tls is not None:
                    await self.tls.check(new.server.tls)
                    self.tls.apply(new.server.tls)   # last: everything else passed
            except ClassifierError as exc:
                return self._refused([f"policies: {exc}"], str(path))
            except ConfigError as exc:
                return self._refused(list(exc.errors), exc.source)
            except RoutingConfigError as exc:
                return self._refused([str(exc)], str(path))
            except KeyFileError as exc:
                return self._refused([f"auth keys: {exc}"], str(path))
            except (TlsError, ClusterKeyError) as exc:
                return self._refused([str(exc)], str(path))
            if cluster is not None:
                cluster.reconfigure(new.cluster, cluster_key)
            return await self.apply(new, t0, authenticator=authenticator, safety=safety)

    def _check_routes(self, new: Config) -> None:
        """Build both tables without publishing them: anything they reject is a config error."""
        table = self.control.registry.table
        self.control.transitional_table(table, new)
        self.control.final_table(table, new)

    def _refused(self, errors: list[str], source: str) -> ReloadResult:
        log.error("reload_failed", source=source, errors=errors,
                  message="config unchanged; the daemon keeps running as before")
        self.control.audit.append(SYSTEM_ACTOR, "config.reload_failed", target="config", reason="SIGHUP",
                                  detail={"source": source, "errors": errors})
        self.state.metrics.config_reloaded(False)
        return ReloadResult(False, tuple(errors))

    async def apply(self, new: Config, t0: float | None = None, *, authenticator=None,
                    safety: Policies | None = None) -> ReloadResult:
        """Apply a validated config; `authenticator`: one `Tenancy.check_keys` built for a changed [auth];
        `safety`: the new config's compiled policies (built here when not given)."""
        t0 = time.monotonic() if t0 is None else t0
        state, control, versions = self.state, self.control, self.versions
        old = state.config
        pools = _pool_changes(old, new, versions)
        if pools:
            log.warning("reload_needs_restart", settings=pools,
                        message="backend/pool changes apply to versions loaded later; loaded ones keep theirs")
        if old.tracing != new.tracing:
            log.warning("reload_needs_restart", settings=["tracing"], message="[tracing] applies from the next start")
        # Phase 1: config objects and routes that can be served now, together.
        before_routes = _routes_summary(control)
        control.registry.swap(lambda t: control.transitional_table(t, new))
        state.config = control.config = new
        if hasattr(state, "response_cache"):
            state.response_cache.resize(new.cache.max_bytes, new.cache.ttl_s)
            opted_in = TenantRegistry(new.tenants)          # a tenant that opted out takes its text with it
            state.response_cache.retain_tenants(lambda tenant: opted_in.get(tenant).cache_responses)
        if hasattr(state, "safety"):
            state.safety = safety if safety is not None else Policies(
                new.policies, lambda tenant: state.tenancy.tenants.get(tenant))
        slos = getattr(state, "slos", None)
        if slos is not None:
            slos.reconfigure(new.slos)
        control.shadows.set_prices(new.prices)
        tenancy = getattr(state, "tenancy", None)
        if tenancy is not None:
            tenancy.reconfigure(new, authenticator)
            if getattr(state, "ledger", None) is not None:      # budgets added or changed: their spend so far
                await load_spend(tenancy.budgets, state.ledger, state.node_name)
        control.configure_rollouts(new)
        control.breakers.reconfigure(new.models)
        versions.server = msgspec.structs.replace(versions.server, **{
            k: getattr(new.server, k) for k in ("drain_grace_s", "request_timeout_s")})
        _refresh_engines(state, versions)

        # New versions load in the background of serving; under a memory budget they stay cold until asked for.
        wanted = version_specs(new)
        lifecycle = getattr(state, "lifecycle", None)
        to_load = [s for s in wanted if (s.model, s.requested) not in versions.loaded]
        if lifecycle is not None:
            await lifecycle.configure(new)
            to_load = []
        loaded = await versions.load_all(to_load)
        failed = tuple(s.label for s in to_load if (s.model, s.requested) not in versions.loaded)

        # Phase 2: the final routes, rollout weights on top; then retire what left the config.
        control.registry.swap(lambda t: control.final_table(t, new))
        keep = {versions.loaded[(s.model, s.requested)] for s in wanted if (s.model, s.requested) in versions.loaded}
        # (a version still `loading` is the lifecycle's, loading on demand: not this reload's to retire)
        gone = [k for k in control.registry.table.versions
                if k not in keep and control.registry.table.state(k) not in ("retired", "loading")]
        for key in gone:
            self.versions.stop_routing(key)       # now: the next request cannot reach it
            if lifecycle is not None:
                lifecycle.retiring(key)           # its bytes stay counted until it unloads
            model = new.models.get(key.model) or old.models.get(key.model)
            # Under a memory budget the lifecycle decides what stays loaded: no warm spares beside it.
            warm_s = model.keep_warm_s if model is not None and lifecycle is None else 0.0
            task = asyncio.get_running_loop().create_task(self._unload(key, warm_s))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        control.start_on_load(new)
        _refresh_engines(state, versions)
        if lifecycle is not None:
            await lifecycle.start()         # pinned and prewarmed versions the new config adds
        control.audit.append(SYSTEM_ACTOR, "config.reload", target="config", before=before_routes,
                             after=_routes_summary(control), reason="SIGHUP",
                             detail={"loaded": [str(k) for k in loaded], "failed": list(failed),
                                     "retired": [str(k) for k in gone]})
        state.metrics.config_reloaded(True)
        result = ReloadResult(True, (), tuple(str(k) for k in loaded), failed, tuple(str(k) for k in gone))
        log.info("reloaded", loaded=list(result.loaded), failed=list(failed), retired=list(result.retired),
                 seconds=round(time.monotonic() - t0, 3))
        return result

    async def _unload(self, key: ModelVersion, keep_warm_s: float = 0.0) -> None:
        """Unload a retired version once idle; first, kept warm `keep_warm_s` (a later reload that lists
        it again revives it, and then it is not unloaded at all)."""
        tenancy = getattr(self.state, "tenancy", None)
        engine = self.control.registry.table.engine(key)
        if keep_warm_s > 0:
            try:
                await self.versions.keep_warm(key, keep_warm_s)     # unloads it when the time is up
            except asyncio.CancelledError:
                if key in self.versions.loaded.values():      # revived: serving again
                    return
                raise
        else:
            await self.versions.unload_when_idle(key)
        self.control.breakers.forget(key)
        if tenancy is not None:
            await tenancy.retire(engine)

    async def wait_retired(self) -> None:
        """Tests and shutdown: wait until every retired version has unloaded."""
        if self._retiring:
            await asyncio.gather(*list(self._retiring), return_exceptions=True)


def _routes_summary(control: ControlPlane) -> dict:
    t = control.registry.table
    return {"defaults": dict(t.defaults),
            "aliases": {n: {str(a.target): a.weight for a in s.arms} for n, s in t.aliases.items()}}


def _refresh_engines(state, versions: VersionManager) -> None:
    state.engines = versions.default_engines(versions.registry.table.defaults)


def routes_changed(state) -> None:
    """The lifecycle loaded or unloaded a version (issue 17): the config's routes over what is loaded now."""
    control = state.control
    control.registry.swap(lambda t: control.final_table(t, state.config))
    control.start_on_load(state.config)
    _refresh_engines(state, state.versions)


def unloaded_hook(state):
    """What goes with a version the lifecycle unloaded: its admission queue and its breaker."""
    async def unloaded(key: ModelVersion, engine) -> None:
        state.control.breakers.forget(key)
        await state.tenancy.retire(engine)
    return unloaded
