"""Loading, warming and retiring engine versions behind the routing registry.

A version's life here: verify its artifact against the manifest, and its signer against the model's
trusted keys when it has any (off the loop) -> construct ->
register as `loading` -> start -> warmup with representative prompt and decode shapes -> `ready`
(routable). Any failure refuses that one version: it is logged naming the model, the version and
(for a tampered artifact) the file, recorded in `failures` for /readyz, and everything else keeps
serving.

Retiring is the reverse and never cuts a stream: `retire` makes the version unroutable at once
(one table swap), then waits until every request that resolved to it has released it, and only
then removes it from the table and closes its engine. Requests `acquire` a version right after
routing, in the same synchronous step, so no request can slip between the two.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import msgspec

from inferd.config import Config, ModelConfig, ServerConfig, artifact_name
from inferd.engine import Engine, run_load
from inferd.models.factory import EngineConfigError
from inferd.models.registry import ModelRegistry
from inferd.models.routing import SpecKey
from inferd.models.specs import VersionSpec, uses_artifact
from inferd.observability import get_logger
from inferd.types import ModelVersion

log = get_logger("inferd.versions")

EngineFactory = Callable[[str, ModelConfig, ServerConfig], Engine]


class VersionManager:
    """Loads, warms and retires engine versions; the registry's table is where they are recorded (which are
    loaded, their engines and states, which configured version each serves): this keeps no copy of it."""

    def __init__(self, registry: ModelRegistry, server: ServerConfig, engine_factory: EngineFactory, *,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.registry = registry
        self.server = server
        self._factory = engine_factory
        self._on_change = on_change
        self.failures: dict[str, str] = {}                        # "model@requested" -> why
        self._in_use: dict[ModelVersion, int] = {}
        self._released: dict[ModelVersion, asyncio.Event] = {}
        self._warm: dict[ModelVersion, asyncio.Task] = {}         # retired, kept loaded a while
        self.step_observer: Callable[[str, Engine], None] | None = None
        self.usage_observer: Callable[[ModelVersion, int], None] | None = None   # +1 acquire, -1 release
        # A retired version was unloaded and its engine closed: (its key, the configured version it was loaded as).
        self.unloaded_observer: Callable[[ModelVersion, SpecKey | None], None] | None = None

    @property
    def loaded(self) -> dict[SpecKey, ModelVersion]:
        """Configured version (model, requested) -> the loaded version it resolves to: the registry's answer."""
        return self.registry.loaded()

    # -- loading ---------------------------------------------------------------------------
    async def load(self, spec: VersionSpec, started: Callable[[Engine], None] | None = None) -> ModelVersion | None:
        """Verify, build, start and warm one version; ready (routable) on success, None on failure.
        `started(engine)`: called between start and warmup (the lifecycle's `warming`)."""
        t0 = time.monotonic()
        key: ModelVersion | None = None
        engine: Engine | None = None
        signer: str | None = None
        try:
            model = spec.config
            version: str | None = None
            if spec.requested != "latest":      # a warm version named outright: back with no verify, no load
                revived = self._revive(spec, spec.requested)
                if revived is not None:
                    return revived
            if uses_artifact(model):
                path, signer = await run_load(self._verified_artifact, spec)
                version = path.name
                model = msgspec.structs.replace(model, version=version, verify=False)  # verified just now
            elif model.trusted_keys and model.trtllm is not None and model.trtllm.engine_dir:
                path, signer = await run_load(self._verified_artifact, spec, Path(model.trtllm.engine_dir))
                model = msgspec.structs.replace(model, verify=False)
            revived = self._revive(spec, version or (spec.requested if spec.requested != "latest" else None))
            if revived is not None:
                return revived
            engine = self._factory(spec.model, model, self.server)
            if version is None:
                version = self._label_version(engine, spec)
            key = ModelVersion(spec.model, version)
            if key in self.registry.table.versions:
                log.warning("version_already_loaded", model=spec.model, version=version, requested=spec.requested)
                await engine.close()
                self.registry.serve_as(key, (spec.model, spec.requested))
                return key
            self.registry.register(key, engine, loaded_as=(spec.model, spec.requested), config=spec.config)
            await engine.start()
            if model.hardware is not None:      # after start: a TensorRT-LLM engine builds its info there
                engine.info = msgspec.structs.replace(engine.info, hardware=model.hardware)
            if self.step_observer is not None:  # after start: the engine's labels come from its info
                self.step_observer(spec.model, engine)
            if started is not None:
                started(engine)
            await engine.warmup()
            if not engine.healthy:
                raise EngineConfigError(spec.model, f"version {version} is unhealthy after warmup")
        except asyncio.CancelledError:
            await self._discard(key, engine)
            raise
        except Exception as exc:  # noqa: BLE001 - one version failing must not stop the others
            await self._discard(key, engine)
            self.failures[spec.label] = str(exc)
            log.error("version_refused", model=spec.model, version=spec.requested, error=str(exc),
                      error_type=type(exc).__name__, file=getattr(exc, "file", None))
            return None
        self.registry.mark_ready(key, serves=(spec.model, spec.requested))
        self.failures.pop(spec.label, None)
        self._on_change()
        info = engine.info
        log.info("version_ready", model=spec.model, version=key.version, backend=info.backend,
                 simulated=info.simulated, signer=signer, seconds=round(time.monotonic() - t0, 3))
        return key

    def _verified_artifact(self, spec: VersionSpec, path: Path | None = None) -> tuple[Path, str | None]:
        """Resolve (unless `path` is given) and verify in a thread: hashing every file of a large artifact
        takes a while. With trusted keys, an unsigned artifact or an unknown signer is refused first.
        Returns the artifact and its signer's fingerprint (None: unsigned)."""
        from inferd.artifacts import (
            ArtifactError,
            SigningKeyError,
            load_trusted_keys,
            resolve_artifact,
            verify_signed_artifact,
        )

        try:
            trusted = load_trusted_keys(spec.config.trusted_keys)
        except SigningKeyError as exc:
            raise EngineConfigError(spec.model, f"trusted_keys: {exc}") from None
        name = artifact_name(spec.model, spec.config)
        try:
            path = path or resolve_artifact(Path(self.server.engines_root), name, spec.requested)
        except (ArtifactError, OSError) as exc:
            raise EngineConfigError(spec.model, f"artifact {name!r} version {spec.requested!r} "
                                                f"under {self.server.engines_root}: {exc}") from None
        try:
            _, signer = verify_signed_artifact(path, trusted)
        except (ArtifactError, OSError) as exc:
            err = EngineConfigError(spec.model, f"artifact {path} failed verification: {exc}")
            err.file = getattr(exc, "file", None)  # type: ignore[attr-defined]
            raise err from None
        return path, signer

    @staticmethod
    def _label_version(engine: Engine, spec: VersionSpec) -> str:
        """Engines without artifacts (sim, trtllm from an engine_dir): a configured version id
        labels this instance; "latest" means whatever the engine reports."""
        info = getattr(engine, "info", None)
        if spec.requested != "latest":
            if info is not None:
                engine.info = msgspec.structs.replace(info, version=spec.requested)
            return spec.requested
        if info is None:
            raise EngineConfigError(spec.model, "backend reports no version before start; configure one")
        return info.version

    async def _discard(self, key: ModelVersion | None, engine: Engine | None) -> None:
        if key is not None and key in self.registry.table.versions and self.registry.table.engine(key) is engine:
            self.registry.remove(key)
        if engine is not None:
            try:
                await engine.close()
            except Exception as exc:  # noqa: BLE001
                log.error("engine_close_failed", error=str(exc), error_type=type(exc).__name__)

    async def load_all(self, specs: Iterable[VersionSpec]) -> list[ModelVersion]:
        keys = []
        for spec in specs:
            key = await self.load(spec)
            if key is not None:
                keys.append(key)
        return keys

    def defaults(self, cfg: Config) -> dict[str, str]:
        """Model name -> loaded version id of its default: the registry's `default_versions`."""
        return self.registry.default_versions(cfg)

    # -- requests --------------------------------------------------------------------------
    def acquire(self, key: ModelVersion) -> None:
        """A request resolved to `key`: keep its engine until `release`. Call right after routing."""
        self._in_use[key] = self._in_use.get(key, 0) + 1
        if self.usage_observer is not None:
            self.usage_observer(key, 1)

    def release(self, key: ModelVersion) -> None:
        if self.usage_observer is not None:
            self.usage_observer(key, -1)
        n = self._in_use.get(key, 0) - 1
        if n > 0:
            self._in_use[key] = n
            return
        self._in_use.pop(key, None)
        event = self._released.get(key)
        if event is not None:
            event.set()

    def in_use(self, key: ModelVersion) -> int:
        return self._in_use.get(key, 0)

    # -- retiring --------------------------------------------------------------------------
    def stop_routing(self, key: ModelVersion) -> bool:
        """Retire `key` now (synchronously: the next request cannot reach it). False if already going."""
        table = self.registry.table
        if key not in table.versions or table.state(key) == "retired":
            return False
        self.registry.retire(key)
        self._on_change()
        log.info("version_retired", model=key.model, version=key.version, in_flight=self.in_use(key))
        return True

    # -- warm spares: kept loaded, unrouted, for a fast rollback ---------------------------
    def keep_warm(self, key: ModelVersion, seconds: float) -> asyncio.Task:
        """After `stop_routing`: keep `key` loaded but unrouted for `seconds`, then unload it once idle.
        A config that lists it again meanwhile (a rollback after a promotion) gets it back at once."""
        task = asyncio.get_running_loop().create_task(self._cool(key, seconds), name=f"warm-{key}")
        self._warm[key] = task
        log.info("version_kept_warm", model=key.model, version=key.version, seconds=seconds)
        return task

    async def _cool(self, key: ModelVersion, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._warm.pop(key, None)
        await self.unload_when_idle(key)

    def _revive(self, spec: VersionSpec, version: str | None) -> ModelVersion | None:
        """The warm version `spec` asks for, routable again; None when there is none to reuse (another
        version, or one loaded with a different engine configuration)."""
        key = ModelVersion(spec.model, version) if version is not None else None
        if key not in self._warm or _engine_shape(self.registry.config_of(key)) != _engine_shape(spec.config):
            return None
        self._warm.pop(key).cancel()
        self.registry.mark_ready(key, serves=(spec.model, spec.requested), config=spec.config)
        self._on_change()
        log.info("version_revived", model=key.model, version=key.version, requested=spec.requested)
        return key

    async def retire(self, key: ModelVersion) -> None:
        """Stop routing to `key` now; close it once its in-flight requests have finished."""
        if self.stop_routing(key):
            await self.unload_when_idle(key)

    async def unload_when_idle(self, key: ModelVersion) -> None:
        """After `stop_routing`: wait for the version's last request, then remove and close it."""
        try:
            if self.in_use(key):
                event = self._released.setdefault(key, asyncio.Event())
                await event.wait()
        finally:
            self._released.pop(key, None)
            if key in self.registry.table.versions:    # close_all may have taken it meanwhile
                loaded_as = self.registry.loaded_as(key)
                engine = self.registry.remove(key)
                self._on_change()
                await self._discard(None, engine)
                log.info("version_unloaded", model=key.model, version=key.version)
                if self.unloaded_observer is not None:
                    self.unloaded_observer(key, loaded_as)

    async def close_all(self) -> None:
        """Shutdown: close every engine (open streams end with finish_reason "abort")."""
        for task in self._warm.values():
            task.cancel()
        self._warm.clear()
        for key in sorted(self.registry.table.versions, reverse=True):
            engine = self.registry.remove(key)
            await self._discard(None, engine)
            log.info("engine_closed", model=key.model, version=key.version)
        self._on_change()

    # -- what the API and /readyz read ------------------------------------------------------
    def default_engines(self, defaults: Mapping[str, str]) -> dict[str, Engine]:
        """Served model name -> the engine of its ready default version."""
        table = self.registry.table
        return {name: table.engine(ModelVersion(name, v)) for name, v in defaults.items()
                if table.is_ready(ModelVersion(name, v))}


def _engine_shape(model: ModelConfig | None) -> ModelConfig | None:
    """What a loaded engine was built from: a model config without its routing-only fields."""
    if model is None:
        return None
    return msgspec.structs.replace(model, version="latest", versions=(), breaker=None, keep_warm_s=0.0,
                                   hardware=None)


class VersionLease:
    """Holds at most one version for one request (`hold` right after routing); `release` is idempotent."""

    __slots__ = ("_manager", "_key")

    def __init__(self, manager: VersionManager | None) -> None:
        self._manager = manager
        self._key: ModelVersion | None = None

    def hold(self, key: ModelVersion) -> None:
        if self._manager is not None and self._key is None:
            self._manager.acquire(key)
            self._key = key

    def release(self) -> None:
        if self._key is not None and self._manager is not None:
            key, self._key = self._key, None
            self._manager.release(key)
