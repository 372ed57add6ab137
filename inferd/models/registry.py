"""The loaded engine versions and the live routing table, swapped whole on every change."""
from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

from inferd.config import ROUTE_NAME_RE, RoutingConfigError, Split
from inferd.models.routing import ModelListing, Route, RoutingTable
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

    def register(self, key: ModelVersion, engine: Any) -> None:
        """A version whose engine is loading: not routable until `mark_ready`."""
        if not ROUTE_NAME_RE.match(key.model) or not key.version or "@" in key.version:
            raise RoutingConfigError(f"bad model version key {key!r}")
        self.swap(lambda t: t.with_version(key, engine, "loading"))

    def mark_ready(self, key: ModelVersion) -> None:
        self.swap(lambda t: t.with_version(key, t.engine(key), "ready"))

    def retire(self, key: ModelVersion) -> None:
        """No new requests; the engine stays reachable via `table.engine` for in-flight streams."""
        self.swap(lambda t: t.with_version(key, t.engine(key), "retired"))

    def remove(self, key: ModelVersion) -> Any:
        """Forget a version; returns its engine for the caller to close."""
        engine = self.table.engine(key)
        self.swap(lambda t: t.without_version(key))
        return engine

    def set_split(self, name: str, split: Split) -> None:
        self.swap(lambda t: t.with_split(name, split))

    def configure(self, *, defaults: Mapping[str, str], aliases: Mapping[str, Split]) -> None:
        self.swap(lambda t: t.with_routes(defaults=defaults, aliases=aliases))

    def resolve(self, model_field: str, tenant: str, user: str | None = None, *,
                request_id: str | None = None) -> Route:
        return self.table.resolve(model_field, tenant, user, request_id=request_id)

    def list_models(self) -> list[ModelListing]:
        return self.table.list_models()
