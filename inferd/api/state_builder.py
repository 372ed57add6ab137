"""`build_state`: the one way to build a ServerState, for the daemon and for tests alike.

Whatever the caller does not pass is built from the config: the tenancy (keys, tenants, quota), the
routing control plane over a version manager, the shadow dispatcher and, under a memory budget
([server] model_memory_bytes), the model lifecycle. Optional features the caller opens itself (the
durable store, the cluster, tracing) stay None when not passed.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from inferd.api.state import ServerState, StoreServices
from inferd.cluster import Cluster
from inferd.config import Config
from inferd.engine import Engine
from inferd.models import (ControlPlane, ModelLifecycle, ShadowDispatcher, VersionManager, build_engine,
                           registry_from_engines)
from inferd.observability import Tracing
from inferd.tenancy import Tenancy

__all__ = ["build_state"]


def build_state(config: Config, engines: Mapping[str, Engine] | None = None, *,
                engine_factory: Callable[..., Engine] = build_engine, tenancy: Tenancy | None = None,
                storage: StoreServices | None = None, cluster: Cluster | None = None,
                tracing: Tracing | None = None) -> ServerState:
    """A complete state over `config`. `engines`: already started engines to serve, one version per
    model (tests, embedders); the daemon passes none and loads its versions into `state.versions`
    (built with `engine_factory`) afterwards. `tenancy`: built from `config` when not given (it reads
    the keys file: the daemon builds it off the loop)."""
    engines = dict(engines or {})
    versions = VersionManager(registry_from_engines(engines), config.server, engine_factory)
    control = ControlPlane(config, versions.registry)
    lifecycle = None
    if config.server.model_memory_bytes is not None:     # cold until asked for, except pinned and prewarmed ones
        # The callbacks run only once the lifecycle is configured, by then `state` is bound.
        lifecycle = ModelLifecycle(versions, config, audit=control.audit,
                                   active_rollout_versions=control.rollouts.active_versions,
                                   on_change=lambda: state.routes_changed(),
                                   on_unloaded=lambda key, engine: state.version_unloaded(key, engine))
    state = ServerState(config, engines, tenancy=tenancy if tenancy is not None else Tenancy(config),
                        registry=versions.registry, versions=versions, control=control,
                        shadows=ShadowDispatcher(control.shadows), storage=storage, cluster=cluster,
                        tracing=tracing, lifecycle=lifecycle)
    # Passed the engine: while versions load, state.engines is still empty, so the name alone labels "other".
    versions.step_observer = state.metrics.observe_engine
    return state
