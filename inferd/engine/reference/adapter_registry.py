"""The reference engine's LoRA adapters: the shared slots (engine.adapter_slots) holding LoraWeights.

Thread-safe (one lock, held only for bookkeeping, never while files are read): the event loop lists,
loads and unloads adapters for the admin API, the step thread pins adapters for its sequences, and a
loader thread reads files (`read`, the part that is this backend's own).

- A source is an adapter directory (`adapter_config.json` + `adapter_model.safetensors`), an artifact
  version directory (the same plus `manifest.toml`), or an artifact's name directory in the artifact
  store (`engines/<name>/`, whose `LATEST` names the version). With a manifest, every file is checked
  against it (sha256) at each load when `verify` is on, and its target must be "lora".
- With `trusted` keys (fingerprint -> .pub path: the model's trusted_keys, else the server's), every load
  first checks the adapter is signed by one of them (adapter_signing): AdapterSignatureError otherwise.
- At most `max_loaded` adapters are loaded, least recently used evicted first, held ones never (the
  slots'). An adapter nobody holds for `idle_unload_s` seconds is unloaded (`unload_idle`, which the
  engine's step thread calls, sleeping at most `idle_wait()` seconds between calls).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from inferd.artifacts import ArtifactError
from inferd.engine.adapter_signing import ADAPTER_TARGET, adapter_version, check_adapter_signature
from inferd.engine.adapter_signing import resolve_adapter_source as resolve_source
from inferd.engine.adapter_slots import AdapterSlots
from inferd.engine.adapters import AdapterInfo, AdapterLoadError
from inferd.engine.reference.lora import LoraWeights, load_lora

__all__ = ["ADAPTER_TARGET", "AdapterRegistry", "check_adapter", "resolve_source"]


class AdapterRegistry(AdapterSlots[LoraWeights]):
    def __init__(self, sources: Mapping[str, str | Path], *, max_loaded: int, idle_unload_s: float | None = None,
                 verify: bool = True, trusted: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_loaded is None:
            raise ValueError(f"max_loaded_adapters must be an integer >= 1, got {max_loaded!r}")
        super().__init__(sources, max_loaded=max_loaded, idle_unload_s=idle_unload_s, clock=clock)
        for name in sources:
            if not isinstance(name, str) or not name or name != name.strip():
                raise ValueError(f"LoRA adapter names must be non-empty strings without edge spaces, got {name!r}")
        self._verify = verify
        self._trusted = dict(trusted or {})
        self._model_config = None

    def bind(self, model_config) -> None:
        """The base model (a LlamaConfig) adapters are checked against; set once the engine loaded it."""
        self._model_config = model_config

    # -- reading (blocking: a loader thread, or asyncio.to_thread) ---------------------------------
    def read(self, name: str) -> LoraWeights:
        """Read, verify and check adapter `name`'s files; installs nothing."""
        source = self.source(name)
        if self._model_config is None:
            raise AdapterLoadError(f"LoRA adapter {name!r}: the base model is not loaded yet", name)
        try:
            directory = resolve_source(source)
            check_adapter_signature(name, directory, self._trusted)   # files: verify_artifact, next
            version = adapter_version(directory, verify=self._verify)
        except ArtifactError as exc:
            raise AdapterLoadError(f"LoRA adapter {name!r}: {exc}", name, exc.file) from exc
        except OSError as exc:
            raise AdapterLoadError(f"LoRA adapter {name!r}: {source}: {exc}", name) from exc
        try:
            return load_lora(name, directory, self._model_config, version)
        except AdapterLoadError:
            raise
        except Exception as exc:  # noqa: BLE001 - a malformed file must be this adapter's error, not a 500
            raise AdapterLoadError(f"LoRA adapter {name!r}: {directory}: unreadable ({type(exc).__name__}: {exc})",
                                   name) from exc

    # -- listing -------------------------------------------------------------------------------
    def info(self, name: str) -> AdapterInfo:
        source = self.source(name)
        use = self.use(name)
        weights = use.payload
        if weights is None:
            return AdapterInfo(name=name, source=str(source), loaded=False)
        return AdapterInfo(name=name, source=str(source), loaded=True, in_use=use.pins, rank=weights.rank,
                           version=weights.version, idle_s=use.idle_s)


def check_adapter(name: str, source: str | Path, base_dir: Path) -> None:
    """What `inferd check-config` asks of one adapter: it loads for the base artifact in `base_dir` (every
    tensor's shape, its config, its manifest's target; not the files' sha256, which every load checks, nor
    its signature, which preflight checks with adapter_signing).
    Raises AdapterLoadError, its `file` a full path when it names one. A base whose config.json does not
    load is the base artifact's own error, left to its load: nothing is checked then."""
    from inferd.engine.reference.config import LlamaConfig, ModelConfigError

    try:
        config = LlamaConfig.from_json(Path(base_dir) / "config.json")
    except ModelConfigError:
        return
    registry = AdapterRegistry({name: source}, max_loaded=1, verify=False)
    registry.bind(config)
    try:
        registry.read(name)
    except AdapterLoadError as exc:
        if exc.file and not Path(exc.file).is_absolute():
            try:
                exc.file = str(resolve_source(Path(source)) / exc.file)
            except (ArtifactError, OSError):
                exc.file = str(Path(source) / exc.file)
        raise
