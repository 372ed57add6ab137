"""LoRA adapters as every backend that serves them shows them: the listing, the errors, the admin methods.

A request names an adapter in `GenerationRequest.lora` (the API's `model: "name:adapter"`). A backend
that serves adapters implements `AdapterHost`: `adapters()` lists every adapter it is configured with,
loaded or not (for `GET /v1/models`), and `load_adapter` / `unload_adapter` are `POST /admin/adapters`.
At submit, an engine refuses an adapter it does not serve with `InvalidRequest(param="model")`
(`unknown_adapter_request`); the admin methods raise the `AdapterError`s below instead.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

from inferd.engine.base import EngineError, InvalidRequest


class AdapterInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One configured adapter, as `adapters()` lists it."""

    name: str
    source: str                   # where its files are ("" when there are none, e.g. the sim)
    loaded: bool
    in_use: int = 0               # sequences holding it; an adapter in use is never unloaded or evicted
    rank: int | None = None       # LoRA rank r, once loaded
    version: str | None = None    # the artifact version, when its directory has a manifest
    idle_s: float | None = None   # seconds since it was last used, when loaded and not in use


class AdapterError(EngineError):
    """An admin operation on adapter `adapter` failed; subclasses say why."""

    def __init__(self, message: str, adapter: str) -> None:
        super().__init__(message)
        self.adapter = adapter


class UnknownAdapter(AdapterError):
    """The engine is configured with no adapter of that name (the API answers 404)."""


class AdapterBusy(AdapterError):
    """Unload: sequences are using it. Load: every adapter slot holds an adapter in use (answer 409)."""


class AdapterLoadError(AdapterError):
    """The adapter's files are missing, malformed, altered (manifest) or do not fit the base model.

    `file` names the culprit file and `tensor` the culprit tensor, when there is one.
    """

    def __init__(self, message: str, adapter: str, file: str | None = None, tensor: str | None = None) -> None:
        super().__init__(message, adapter)
        self.file = file
        self.tensor = tensor


class AdapterSources:
    """An engine's configured adapters by name, and where their files are: what every backend's adapter
    bookkeeping shares. A subclass says what it knows of one adapter in `info`."""

    def __init__(self, sources: Mapping[str, str | Path]) -> None:
        self._sources = {name: Path(path) for name, path in sources.items()}

    def __contains__(self, name: object) -> bool:
        return name in self._sources

    def names(self) -> list[str]:
        return sorted(self._sources)

    def source(self, name: str) -> Path:
        """Where adapter `name`'s files are; UnknownAdapter (naming the configured ones) when none is."""
        try:
            return self._sources[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise UnknownAdapter(f"no LoRA adapter {name!r} is configured (configured: {known})", name) from None

    def info(self, name: str) -> AdapterInfo:
        raise NotImplementedError

    def infos(self) -> list[AdapterInfo]:
        return [self.info(name) for name in self.names()]


@runtime_checkable
class AdapterHost(Protocol):
    """What the API layer calls on an engine that serves LoRA adapters."""

    def adapters(self) -> list[AdapterInfo]:
        """Every configured adapter, loaded or not, sorted by name. Never blocks."""
        ...

    def adapter(self, name: str) -> AdapterInfo | None:
        """One adapter's state, None when none of that name is configured (the request path's check)."""
        ...

    async def load_adapter(self, name: str) -> AdapterInfo:
        """Load it now (files read and checked off the loop); already loaded is fine.
        Raises UnknownAdapter, AdapterLoadError or AdapterBusy."""
        ...

    async def unload_adapter(self, name: str) -> bool:
        """Unload it; False when it was not loaded. Raises UnknownAdapter, or AdapterBusy while in use."""
        ...


def unknown_adapter_request(name: str, served: Iterable[str]) -> InvalidRequest:
    """The submit-time refusal of an adapter the engine does not serve (param `model`)."""
    names = sorted(served)
    known = f"; this model serves: {', '.join(names)}" if names else "; this model serves no LoRA adapters"
    return InvalidRequest(f"unknown LoRA adapter {name!r}{known}", "model")
