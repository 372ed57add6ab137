"""The loaded engine versions and the live routing table, swapped whole on every change.

The one owner of which versions are loaded: each entry of `table.versions` holds the version's engine,
its state (loading, ready, retired), the configured version it was loaded as and the configured versions
that resolve to it. VersionManager (loading, retiring), ModelLifecycle (the memory budget) and
ControlPlane (routes, rollouts) read and change it here; none keeps a copy.
"""
from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from inferd.config import ROUTE_NAME_RE, Config, RoutingConfigError, Split
from inferd.models.routing import ModelListing, Route, RoutingTable, SpecKey, VersionEntry
from inferd.types import ModelVersion


class ModelRegistry:
    """The loaded engine versions and the live routing table.

    Writers (the daemon, a reload, a rollout) serialise on a lock and swap `table`; readers use
    `registry.table` (or the delegating `resolve`) with no lock at all.
    """

    def __init__(self, *, defaults: Mapping[str, str] | None = None, aliases: Mapping[str, Split] | None = None,
                 rng: random.Random | None = None) -> None:
        self._lock = threading.Lock()
        self.table = RoutingTable(defaults=defaults, aliases=aliases, rng=rng)

    def swap(self, change: Callable[[RoutingTable], RoutingTable]) -> RoutingTable:
        """Apply `change` to the current table and publish the result in one reference swap.
        Several edits in one `change` become visible together."""
        with self._lock:
            new = change(self.table)
            self.table = new
            return new

    def register(self, key: ModelVersion, engine: Any, *, loaded_as: SpecKey | None = None,
                 config: Any = None) -> None:
        """A version whose engine is loading: not routable until `mark_ready`. `loaded_as`: the configured
        version being loaded; `config`: the ModelConfig it is built from."""
        if not ROUTE_NAME_RE.match(key.model) or not key.version or "@" in key.version:
            raise RoutingConfigError(f"bad model version key {key!r}")
        self.swap(lambda t: t.with_entry(key, VersionEntry(engine, "loading", loaded_as=loaded_as, config=config)))

    def mark_ready(self, key: ModelVersion, *, serves: SpecKey | None = None, config: Any = None) -> None:
        """Routable; `serves`: a configured version that now resolves to it (taken from any other)."""
        def change(t: RoutingTable) -> RoutingTable:
            entry = self._entry(t, key)
            entry = msgspec.structs.replace(entry, state="ready", config=entry.config if config is None else config)
            return self._serving(t, key, entry, serves)
        self.swap(change)

    def serve_as(self, key: ModelVersion, spec: SpecKey) -> None:
        """The configured version `spec` resolves to loaded `key` (its load found `key` already loaded)."""
        self.swap(lambda t: self._serving(t, key, self._entry(t, key), spec))

    def retire(self, key: ModelVersion) -> None:
        """No new requests; the engine stays reachable via `table.engine` for in-flight streams."""
        self.swap(lambda t: t.with_entry(key, msgspec.structs.replace(self._entry(t, key), state="retired",
                                                                      serves=())))

    def remove(self, key: ModelVersion) -> Any:
        """Forget a version; returns its engine for the caller to close."""
        engine = self.table.engine(key)
        self.swap(lambda t: t.without_version(key))
        return engine

    @staticmethod
    def _entry(t: RoutingTable, key: ModelVersion) -> VersionEntry:
        t.engine(key)               # VersionNotLoaded when it is not in the table
        return t.versions[key]

    @staticmethod
    def _serving(t: RoutingTable, key: ModelVersion, entry: VersionEntry, spec: SpecKey | None) -> RoutingTable:
        """`t` with `entry` at `key`, and `spec` (when given) resolving to `key` and to nothing else."""
        if spec is None:
            return t.with_entry(key, entry)
        for other, e in t.versions.items():
            if other != key and spec in e.serves:
                t = t.with_entry(other, msgspec.structs.replace(e, serves=tuple(s for s in e.serves if s != spec)))
        if spec not in entry.serves:
            entry = msgspec.structs.replace(entry, serves=(*entry.serves, spec))
        return t.with_entry(key, entry)

    # -- what the loaded versions are, for the configuration ---------------------------------
    def loaded(self) -> dict[SpecKey, ModelVersion]:
        """Configured version -> the loaded version it resolves to (retired ones resolve to nothing)."""
        return {spec: key for key, e in self.table.versions.items() for spec in e.serves}

    def serving(self, spec: SpecKey) -> ModelVersion | None:
        """The loaded version the configured version `spec` resolves to, if any."""
        return next((key for key, e in self.table.versions.items() if spec in e.serves), None)

    def loaded_as(self, key: ModelVersion) -> SpecKey | None:
        """The configured version whose load brought `key` up (None: not loaded, or loaded without one)."""
        entry = self.table.versions.get(key)
        return entry.loaded_as if entry is not None else None

    def config_of(self, key: ModelVersion) -> Any:
        """The ModelConfig `key` was loaded with (None: not loaded, or loaded without one)."""
        entry = self.table.versions.get(key)
        return entry.config if entry is not None else None

    def default_versions(self, cfg: Config) -> dict[str, str]:
        """Model name -> loaded version id of its default ("latest" resolved); unloaded ones
        keep the requested id, so routes naming them wait instead of failing validation."""
        loaded = self.loaded()
        return {name: (loaded.get((name, m.version)) or ModelVersion(name, m.version)).version
                for name, m in cfg.models.items()}

    def set_split(self, name: str, split: Split) -> None:
        self.swap(lambda t: t.with_split(name, split))

    def configure(self, *, defaults: Mapping[str, str], aliases: Mapping[str, Split]) -> None:
        self.swap(lambda t: t.with_routes(defaults=defaults, aliases=aliases))

    def resolve(self, model_field: str, tenant: str, user: str | None = None, *,
                request_id: str | None = None, priority: str | None = None, tiers: bool = True) -> Route:
        return self.table.resolve(model_field, tenant, user, request_id=request_id, priority=priority, tiers=tiers)

    def list_models(self) -> list[ModelListing]:
        return self.table.list_models()


def registry_from_engines(engines: Mapping[str, Any]) -> ModelRegistry:
    """A registry serving already started engines, one version per model (tests, embedders)."""
    defaults = {name: engine.info.version for name, engine in engines.items()}
    registry = ModelRegistry(defaults=defaults)
    for name, engine in engines.items():
        key = ModelVersion(name, engine.info.version)
        registry.register(key, engine)
        registry.mark_ready(key)
    return registry
