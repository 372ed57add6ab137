"""Model versions and where requests go: engines from config, loading, routing, rollouts, shadow, the control plane."""
from __future__ import annotations

from inferd.models.breaker import BreakerOpen, Breakers, BreakerState
from inferd.models.control import ControlPlane, audit_path
from inferd.models.errors import RoutingError
from inferd.models.factory import SYNTHETIC_KINDS, EngineConfigError, build_engine, missing_synthetic
from inferd.models.memory_budget import LifecycleError, ModelLifecycle
from inferd.models.prewarm import run_schedule as run_prewarm_schedule
from inferd.models.registry import ModelRegistry, registry_from_engines
from inferd.models.rollout import Rollout, RolloutError, RolloutNotFound
from inferd.models.routing import Route, RoutingTable
from inferd.models.shadow import ShadowDispatcher
from inferd.models.specs import routes_from_config, uses_artifact, version_specs
from inferd.models.versions import VersionLease, VersionManager

__all__ = [
    "SYNTHETIC_KINDS", "BreakerOpen", "BreakerState", "Breakers", "ControlPlane", "EngineConfigError",
    "LifecycleError", "ModelLifecycle", "ModelRegistry", "Rollout", "RolloutError", "RolloutNotFound", "Route",
    "RoutingError", "RoutingTable", "ShadowDispatcher", "VersionLease", "VersionManager", "build_engine",
    "missing_synthetic", "audit_path", "registry_from_engines", "routes_from_config", "run_prewarm_schedule",
    "uses_artifact", "version_specs",
]
