"""A reload's two routing steps: the routes that can be served now, then the versions the new config lists.

`ModelsReload.routes` (phase 1, one step on the loop): the new Config object and the new routes and
weights go live together in one routing-table swap; a route whose new targets are not loaded yet keeps
its current split until they are (never a 503 gap).

`ModelsReload.versions` (last): new versions load and warm in the background of serving (verified first;
a failing one is refused alone; under a memory budget they stay cold until asked for); then phase 2,
one swap: the final routes, with every rollout's current weights re-applied on top
(`RolloutManager.overlay`), so a reload never undoes a canary step or a rollback. Versions no longer in
the config are retired: no new requests from this instant; each closes when its last stream has finished
(`VersionManager.retire`), after `keep_warm_s` if its model sets one.
"""
from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from inferd.api import ServerState
from inferd.config import Config
from inferd.models import ControlPlane, VersionManager, version_specs
from inferd.observability import SYSTEM_ACTOR, get_logger
from inferd.types import ModelVersion

log = get_logger("inferd.reload")


class ModelsReload:
    """The routing control plane's part of a reload, as two steps (`routes`, `versions`)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.routes = _RoutesStep(self)
        self.versions = _VersionsStep(self)
        self.previous: Config = state.config    # the config before the reload being applied
        self.routes_before: dict = {}
        self._retiring: set[asyncio.Task[None]] = set()

    def retire(self, gone: list[ModelVersion]) -> None:
        state = self.state
        lifecycle = state.lifecycle
        for key in gone:
            state.versions.stop_routing(key)       # now: the next request cannot reach it
            if lifecycle is not None:
                lifecycle.retiring(key)            # its bytes stay counted until it unloads
            model = state.config.models.get(key.model) or self.previous.models.get(key.model)
            # Under a memory budget the lifecycle decides what stays loaded: no warm spares beside it.
            warm_s = model.keep_warm_s if model is not None and lifecycle is None else 0.0
            task = asyncio.get_running_loop().create_task(self._unload(key, warm_s))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _unload(self, key: ModelVersion, keep_warm_s: float = 0.0) -> None:
        """Unload a retired version once idle; first, kept warm `keep_warm_s` (a later reload that lists
        it again revives it, and then it is not unloaded at all)."""
        versions, control = self.state.versions, self.state.control
        engine = control.registry.table.engine(key)
        if keep_warm_s > 0:
            try:
                await versions.keep_warm(key, keep_warm_s)     # unloads it when the time is up
            except asyncio.CancelledError:
                if key in versions.loaded.values():      # revived: serving again
                    return
                raise
        else:
            await versions.unload_when_idle(key)
        await self.state.version_unloaded(key, engine)

    async def wait_retired(self) -> None:
        """Tests and shutdown: wait until every retired version has unloaded."""
        if self._retiring:
            await asyncio.gather(*list(self._retiring), return_exceptions=True)


class _RoutesStep:
    def __init__(self, models: ModelsReload) -> None:
        self._models = models

    async def check(self, new: Config) -> None:
        """Build both tables without publishing them: anything they reject is a config error."""
        control = self._models.state.control
        table = control.registry.table
        control.transitional_table(table, new)
        control.final_table(table, new)

    async def reconfigure(self, new: Config, checked: Any = None) -> None:
        models, state = self._models, self._models.state
        control, old = state.control, state.config
        pools = _pool_changes(old, new, state.versions)
        if pools:
            log.warning("reload_needs_restart", settings=pools,
                        message="backend/pool changes apply to versions loaded later; loaded ones keep theirs")
        if old.tracing != new.tracing:
            log.warning("reload_needs_restart", settings=["tracing"], message="[tracing] applies from the next start")
        models.previous, models.routes_before = old, _routes_summary(control)
        control.registry.swap(lambda t: control.transitional_table(t, new))
        state.config = control.config = new


class _VersionsStep:
    def __init__(self, models: ModelsReload) -> None:
        self._models = models

    async def check(self, new: Config) -> None:
        return None

    async def reconfigure(self, new: Config, checked: Any = None) -> dict[str, tuple[str, ...]]:
        models, state = self._models, self._models.state
        control, versions, lifecycle = state.control, state.versions, state.lifecycle
        control.configure_rollouts(new)
        control.breakers.reconfigure(new.models)
        versions.server = msgspec.structs.replace(versions.server, **{
            k: getattr(new.server, k) for k in ("drain_grace_s", "request_timeout_s")})
        state.refresh_engines()
        wanted = version_specs(new)
        to_load = [s for s in wanted if (s.model, s.requested) not in versions.loaded]
        if lifecycle is not None:
            await lifecycle.configure(new)
            to_load = []
        loaded = await versions.load_all(to_load)
        failed = tuple(s.label for s in to_load if (s.model, s.requested) not in versions.loaded)
        control.registry.swap(lambda t: control.final_table(t, new))      # phase 2
        keep = {versions.loaded[(s.model, s.requested)] for s in wanted if (s.model, s.requested) in versions.loaded}
        # (a version still `loading` is the lifecycle's, loading on demand: not this reload's to retire)
        gone = [k for k in control.registry.table.versions
                if k not in keep and control.registry.table.state(k) not in ("retired", "loading")]
        models.retire(gone)
        control.start_on_load(new)
        state.refresh_engines()
        if lifecycle is not None:
            await lifecycle.start()         # pinned and prewarmed versions the new config adds
        control.audit.append(SYSTEM_ACTOR, "config.reload", target="config", before=models.routes_before,
                             after=_routes_summary(control), reason="SIGHUP",
                             detail={"loaded": [str(k) for k in loaded], "failed": list(failed),
                                     "retired": [str(k) for k in gone]})
        return {"loaded": tuple(str(k) for k in loaded), "failed": failed, "retired": tuple(str(k) for k in gone)}


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


def _routes_summary(control: ControlPlane) -> dict:
    t = control.registry.table
    return {"defaults": dict(t.defaults),
            "aliases": {n: {str(a.target): a.weight for a in s.arms} for n, s in t.aliases.items()}}
