"""A model's LoRA adapters in the config: `lora_adapters` (name -> source), checked and resolved, for every backend.

One key serves every backend: `[models.<name>] lora_adapters = { sql = "engines/sql-lora" }`. The
reference engine reads the sources (PEFT directories or adapter artifacts, docs/models.md); the sim
serves the names and reads nothing (a source may be ""); trtllm hands the directories to TensorRT-LLM.
`[models.<name>.trtllm] lora_adapters`, trtllm's older spelling, still works, not together with the
top-level key. `max_loaded_adapters` and `adapter_idle_unload_s` size the reference engine's LRU.
Requests name an adapter as `model: "name:adapter"`, so names are plain: no `:`, `@` or spaces.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

ADAPTER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def served_adapters(model) -> Mapping[str, str]:
    """Adapter name -> source of a ModelConfig: its `lora_adapters`, else its trtllm table's (the alias)."""
    if model.lora_adapters:
        return model.lora_adapters
    return model.trtllm.lora_adapters if model.trtllm is not None else {}


def adapter_errors(path: str, model) -> list[str]:
    """`path.key: problem` lines for a decoded ModelConfig's adapter keys (`path` is `models.<name>`)."""
    errors = []
    nested = model.trtllm.lora_adapters if model.trtllm is not None else {}
    if model.lora_adapters and nested:
        errors.append(f"{path}.trtllm.lora_adapters: adapters are set in {path}.lora_adapters too; "
                      f"keep one table ({path}.lora_adapters serves every backend)")
    for key, adapters in ((f"{path}.lora_adapters", model.lora_adapters), (f"{path}.trtllm.lora_adapters", nested)):
        for name, source in adapters.items():
            if not ADAPTER_NAME_RE.match(name):
                errors.append(f"{key}.{name}: an adapter name must match {ADAPTER_NAME_RE.pattern} "
                              "(requests name it as model:adapter, so no ':', '@' or spaces)")
            elif not source and model.backend != "sim":
                errors.append(f"{key}.{name}: must name the adapter's directory (only the sim reads no files)")
    if model.max_loaded_adapters < 1:
        errors.append(f"{path}.max_loaded_adapters: must be >= 1, got {model.max_loaded_adapters}")
    idle = model.adapter_idle_unload_s
    if idle is not None and not 0 < idle < math.inf:
        errors.append(f"{path}.adapter_idle_unload_s: must be > 0 seconds (leave it out: never), got {idle}")
    return errors


def resolve_adapters(adapters: Mapping[str, str], resolve: Callable[[str], str]) -> dict[str, str]:
    """Each source resolved (against the config file's directory); an empty one (sim) stays empty."""
    return {name: resolve(source) if source else source for name, source in adapters.items()}
