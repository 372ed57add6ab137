"""The reference engine's LoRA adapters: which are configured, which are loaded (an LRU), which are in use.

Thread-safe (one lock, held only for bookkeeping, never while files are read): the event loop lists,
loads and unloads adapters for the admin API, the step thread pins adapters for its sequences, and a
loader thread reads files.

- A source is an adapter directory (`adapter_config.json` + `adapter_model.safetensors`), an artifact
  version directory (the same plus `manifest.toml`), or an artifact's name directory in the artifact
  store (`engines/<name>/`, whose `LATEST` names the version). With a manifest, every file is checked
  against it (sha256) at each load when `verify` is on, and its target must be "lora".
- With `trusted` keys (fingerprint -> .pub path: the model's trusted_keys, else the server's), every load
  first checks the adapter is signed by one of them (adapter_signing): AdapterSignatureError otherwise.
- At most `max_loaded` adapters are loaded. Installing one more evicts the least recently used adapter
  that no sequence holds; when every loaded adapter is held, `install` raises AdapterBusy.
- An adapter nobody holds for `idle_unload_s` seconds is unloaded (`unload_idle`, which the engine's
  step thread calls, sleeping at most `idle_wait()` seconds between calls).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

from inferd.artifacts import MANIFEST_FILE, ArtifactError, read_manifest, verify_artifact
from inferd.engine.adapter_signing import check_adapter_signature
from inferd.engine.adapter_signing import resolve_adapter_source as resolve_source
from inferd.engine.adapters import AdapterBusy, AdapterInfo, AdapterLoadError, AdapterSources
from inferd.engine.reference.lora import LoraWeights, load_lora

ADAPTER_TARGET = "lora"       # the manifest target of an adapter artifact

__all__ = ["ADAPTER_TARGET", "AdapterRegistry", "check_adapter", "resolve_source"]


class AdapterRegistry(AdapterSources):
    def __init__(self, sources: Mapping[str, str | Path], *, max_loaded: int, idle_unload_s: float | None = None,
                 verify: bool = True, trusted: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(max_loaded, bool) or not isinstance(max_loaded, int) or max_loaded < 1:
            raise ValueError(f"max_loaded_adapters must be an integer >= 1, got {max_loaded!r}")
        if idle_unload_s is not None and not idle_unload_s > 0:
            raise ValueError(f"adapter_idle_unload_s must be > 0 (or None: never), got {idle_unload_s!r}")
        for name in sources:
            if not isinstance(name, str) or not name or name != name.strip():
                raise ValueError(f"LoRA adapter names must be non-empty strings without edge spaces, got {name!r}")
        super().__init__(sources)
        self.max_loaded, self.idle_unload_s, self._verify, self._clock = max_loaded, idle_unload_s, verify, clock
        self._trusted = dict(trusted or {})
        self._model_config = None
        self._lock = threading.Lock()
        self._loaded: OrderedDict[str, LoraWeights] = OrderedDict()   # least recently used first
        self._pins: dict[str, int] = {}
        self._last_used: dict[str, float] = {}

    def bind(self, model_config) -> None:
        """The base model (a LlamaConfig) adapters are checked against; set once the engine loaded it."""
        self._model_config = model_config

    def is_loaded(self, name: str) -> bool:
        with self._lock:
            return name in self._loaded

    # -- reading (blocking: a loader thread, or asyncio.to_thread) ---------------------------------
    def read(self, name: str) -> LoraWeights:
        """Read, verify and check adapter `name`'s files; installs nothing."""
        source = self.source(name)
        if self._model_config is None:
            raise AdapterLoadError(f"LoRA adapter {name!r}: the base model is not loaded yet", name)
        try:
            directory = resolve_source(source)
            version = None
            check_adapter_signature(name, directory, self._trusted)   # files: verify_artifact, next
            if (directory / MANIFEST_FILE).is_file():
                manifest = verify_artifact(directory) if self._verify else read_manifest(directory)
                if manifest.target != ADAPTER_TARGET:
                    raise ArtifactError(f"{directory}: manifest target is {manifest.target!r}, not "
                                        f"{ADAPTER_TARGET!r} (not an adapter artifact)", MANIFEST_FILE)
                version = manifest.version
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

    # -- loaded adapters and pins --------------------------------------------------------------
    def install(self, name: str, weights: LoraWeights, pins: int = 0) -> LoraWeights:
        """Make `weights` the loaded adapter `name` (an already loaded one is kept and returned), with
        `pins` holders. Evicts the least recently used adapter nobody holds when all slots are taken."""
        self.source(name)
        with self._lock:
            if name not in self._loaded:
                if len(self._loaded) >= self.max_loaded:
                    victim = next((n for n in self._loaded if not self._pins.get(n)), None)
                    if victim is None:
                        raise AdapterBusy(f"LoRA adapter {name!r}: all {self.max_loaded} adapter slots hold "
                                          "adapters in use", name)
                    self._drop(victim)
                self._loaded[name] = weights
            self._pins[name] = self._pins.get(name, 0) + pins
            return self._touch(name)

    def acquire(self, name: str) -> LoraWeights | None:
        """Adapter `name`, pinned for one more holder, if it is loaded (else None, nothing pinned)."""
        with self._lock:
            if name not in self._loaded:
                return None
            self._pins[name] = self._pins.get(name, 0) + 1
            return self._touch(name)

    def release(self, name: str) -> None:
        """One holder of adapter `name` let go of it."""
        with self._lock:
            held = self._pins.get(name, 0)
            if held > 0:
                self._pins[name] = held - 1
                self._last_used[name] = self._clock()

    def unload(self, name: str) -> bool:
        """Unload adapter `name`; False when it was not loaded. AdapterBusy while it is held."""
        self.source(name)
        with self._lock:
            if name not in self._loaded:
                return False
            if self._pins.get(name):
                raise AdapterBusy(f"LoRA adapter {name!r} is in use by {self._pins[name]} sequence(s)", name)
            self._drop(name)
            return True

    def unload_idle(self) -> list[str]:
        """Unload every adapter nobody has held for idle_unload_s; returns their names."""
        if self.idle_unload_s is None:
            return []
        with self._lock:
            cutoff = self._clock() - self.idle_unload_s
            idle = [n for n in self._loaded if not self._pins.get(n) and self._last_used[n] <= cutoff]
            for name in idle:
                self._drop(name)
            return idle

    def has_room(self) -> bool:
        """True when install() would find a slot now: one is empty, or holds an adapter nobody holds."""
        with self._lock:
            return len(self._loaded) < self.max_loaded or any(not self._pins.get(n) for n in self._loaded)

    def idle_wait(self) -> float | None:
        """Seconds until the next adapter becomes idle long enough to unload (None: none will)."""
        if self.idle_unload_s is None:
            return None
        with self._lock:
            free = [self._last_used[n] for n in self._loaded if not self._pins.get(n)]
            if not free:
                return None
            return max(0.0, min(free) + self.idle_unload_s - self._clock())

    # -- listing -------------------------------------------------------------------------------
    def info(self, name: str) -> AdapterInfo:
        source = self.source(name)
        with self._lock:
            weights, pins = self._loaded.get(name), self._pins.get(name, 0)
            idle = self._clock() - self._last_used[name] if weights is not None and not pins else None
        if weights is None:
            return AdapterInfo(name=name, source=str(source), loaded=False)
        return AdapterInfo(name=name, source=str(source), loaded=True, in_use=pins, rank=weights.rank,
                           version=weights.version, idle_s=idle)

    def _touch(self, name: str) -> LoraWeights:
        self._loaded.move_to_end(name)
        self._last_used[name] = self._clock()
        return self._loaded[name]

    def _drop(self, name: str) -> None:
        del self._loaded[name]
        self._pins.pop(name, None)
        self._last_used.pop(name, None)


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
