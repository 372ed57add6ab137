"""The trtllm backend's LoRA adapters: which are configured, which are loaded, the LoRARequest of each.

TensorRT-LLM's LLM API (docs/trtllm-api.md §6) has no call to load or unload an adapter: a request
carries a `LoRARequest(lora_name, lora_int_id, lora_path)` and the worker reads the adapter's weights
into its PEFT cache on the first request with that `lora_int_id` (the cache key), reusing them after;
the cache evicts by its own LRU (`lora_config.max_loras` / `max_cpu_loras`). So here, per adapter:

- **load** = check the directory off the loop (it exists and is an HF/PEFT LoRA directory:
  `adapter_config.json` with a LoRA rank `r`, and `adapter_model.safetensors` or `adapter_model.bin`;
  an artifact's name directory is resolved through `LATEST`; with trusted keys, the artifact's signature;
  with a manifest and `verify`, its files' sha256), then build its LoRARequest with a **fresh**
  `lora_int_id`, so weights changed on disk since an earlier load are read again, never served from a
  stale cache entry. Nothing reaches the GPU until a request names it.
- **unload** = forget the LoRARequest: requests naming the adapter are refused until it is loaded again.
  Weights TensorRT-LLM already cached stay there until its LRU evicts them; no call frees them sooner.

Event-loop only, except `check`, which reads files (run it in a thread).
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from inferd.artifacts import ArtifactError
from inferd.engine.adapter_signing import adapter_version, check_adapter_signature, resolve_adapter_source
from inferd.engine.adapter_slots import AdapterSlots
from inferd.engine.adapters import AdapterInfo, AdapterLoadError

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


class CheckedAdapter:
    """What `check` found: the directory to hand to TensorRT-LLM, its rank and its artifact version."""

    def __init__(self, directory: Path, rank: int, version: str | None) -> None:
        self.directory, self.rank, self.version = directory, rank, version


class TrtllmLoras(AdapterSlots[tuple[Any, CheckedAdapter]]):
    """The loaded table is the engines' shared slots, name -> (LoRARequest, what check found), with no
    limit and no holders: TensorRT-LLM's PEFT cache evicts weights by its own LRU, and a running request
    keeps the LoRARequest it was sent with."""

    def __init__(self, sources: Mapping[str, str | Path], *, trusted: Mapping[str, str] | None = None,
                 verify: bool = True) -> None:
        super().__init__(sources)
        self._trusted, self._verify = dict(trusted or {}), verify
        self._ids = itertools.count(1)
        self._refused: dict[str, str] = {}                            # name -> why its last load failed

    # -- blocking: asyncio.to_thread -------------------------------------------------------------
    def check(self, name: str) -> CheckedAdapter:
        """Adapter `name`'s directory, checked as described above. Raises AdapterLoadError (or its
        AdapterSignatureError) naming the adapter and the file, UnknownAdapter."""
        source = self.source(name)
        directory = source
        try:
            directory = resolve_adapter_source(source)
            if not directory.is_dir():
                raise AdapterLoadError(f"LoRA adapter {name!r}: {directory} is not a directory", name, str(directory))
            check_adapter_signature(name, directory, self._trusted)
            version = adapter_version(directory, verify=self._verify)
            rank = _peft_rank(name, directory)
        except ArtifactError as exc:
            file = str(directory / exc.file) if exc.file else None
            raise AdapterLoadError(f"LoRA adapter {name!r}: {exc}", name, file) from exc
        except OSError as exc:
            raise AdapterLoadError(f"LoRA adapter {name!r}: {source}: {exc}", name) from exc
        return CheckedAdapter(directory, rank, version)

    # -- event loop ------------------------------------------------------------------------------
    def register(self, name: str, checked: CheckedAdapter, make_request: Callable[[str, int, str], Any]) -> None:
        """Record adapter `name` as loaded: a LoRARequest (from `make_request(name, id, path)`) with a
        fresh id. The API's ValueError (a path gone since the check) becomes AdapterLoadError."""
        try:
            request = make_request(name, next(self._ids), str(checked.directory))
        except ValueError as exc:
            raise AdapterLoadError(f"LoRA adapter {name!r}: TensorRT-LLM refused it: {exc}", name,
                                   str(checked.directory)) from exc
        super().unload(name)            # the fresh id replaces the old one
        self.install(name, (request, checked))
        self._refused.pop(name, None)

    def refuse(self, name: str, why: str) -> None:
        """A load of `name` failed: it stays (or becomes) unloaded, and requests naming it say why."""
        if name in self:
            super().unload(name)
        self._refused[name] = why

    def unload(self, name: str) -> bool:
        self.source(name)
        self._refused.pop(name, None)
        return super().unload(name)

    def request_for(self, name: str) -> Any | None:
        """The LoRARequest of loaded adapter `name`; None when it is not loaded."""
        entry = self.loaded(name)
        return entry[0] if entry is not None else None

    def not_loaded_reason(self, name: str) -> str:
        why = self._refused.get(name)
        if why is not None:
            return f"LoRA adapter {name!r} could not be loaded ({why}); fix it, then POST /admin/adapters loads it"
        return f"LoRA adapter {name!r} is not loaded (it was unloaded); POST /admin/adapters loads it"

    def info(self, name: str) -> AdapterInfo:
        source = self.source(name)
        entry = self.loaded(name)
        if entry is None:
            return AdapterInfo(name=name, source=str(source), loaded=False)
        return AdapterInfo(name=name, source=str(source), loaded=True, rank=entry[1].rank, version=entry[1].version)


def check_trtllm_adapter(name: str, source: str | Path) -> int:
    """What `inferd check-config` asks of a trtllm model's adapter: that its directory is an HF/PEFT LoRA
    directory (the signature is checked apart); returns its rank. AdapterLoadError names the file."""
    try:
        directory = resolve_adapter_source(Path(source))
    except (ArtifactError, OSError) as exc:
        raise AdapterLoadError(f"LoRA adapter {name!r}: {exc}", name) from exc
    return _peft_rank(name, directory)


def _peft_rank(name: str, directory: Path) -> int:
    """The LoRA rank of an HF/PEFT adapter directory (what `lora_ckpt_source="hf"` reads)."""
    config_path = directory / CONFIG_FILE
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterLoadError(f"LoRA adapter {name!r}: {directory} has no {CONFIG_FILE} (not an HF/PEFT LoRA "
                               "directory)", name, str(config_path)) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AdapterLoadError(f"LoRA adapter {name!r}: {config_path}: not JSON ({exc})", name,
                               str(config_path)) from None
    if not isinstance(config, dict):
        raise AdapterLoadError(f"LoRA adapter {name!r}: {config_path}: expected a JSON object", name, str(config_path))
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise AdapterLoadError(f"LoRA adapter {name!r}: {config_path}: peft_type {peft_type!r} is not LoRA", name,
                               str(config_path))
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterLoadError(f"LoRA adapter {name!r}: {config_path}: `r` must be a positive integer, got {rank!r}",
                               name, str(config_path))
    if not any((directory / f).is_file() for f in WEIGHT_FILES):
        raise AdapterLoadError(f"LoRA adapter {name!r}: {directory} has no {' or '.join(WEIGHT_FILES)}", name,
                               str(directory / WEIGHT_FILES[0]))
    return rank
