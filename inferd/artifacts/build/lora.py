"""LoRA adapter artifacts (PEFT format) for the reference engine.

- `write_peft_adapter(directory, tensors, ...)`: an adapter directory as PEFT's `save_pretrained` writes
  it (`adapter_config.json` + `adapter_model.safetensors`), no manifest.
- `synthetic_adapter_tensors(base_config, ...)`: random A/B matrices for a base model's config.json,
  deterministic per (seed, tensor name): the test suite's adapters for the tiny model.
- `build_synthetic_adapter(base_dir, name, engines_root)` / `pack_peft(adapter_dir, base_dir, name,
  engines_root)`: publish one into the artifact store as `engines/<name>/<version>/` with manifest target
  "lora" and the base model's architecture; the engine verifies it (sha256) at every load.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from inferd.artifacts.manifest import ArtifactError, Progress, publish_artifact, read_manifest, staging_dir

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MODULE = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def adapter_key(layer: int, projection: str, which: str) -> str:
    """PEFT's saved name of a LoRA matrix: which = "A" or "B"."""
    return f"base_model.model.model.layers.{layer}.{_MODULE[projection]}.{projection}.lora_{which}.weight"


def _shapes(config: dict) -> dict[str, tuple[int, int]]:
    h, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    hd = int(config.get("head_dim") or h // heads)
    q, kv, inter = heads * hd, int(config.get("num_key_value_heads") or heads) * hd, int(config["intermediate_size"])
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def synthetic_adapter_tensors(base_config: dict, *, rank: int = 4, targets: Iterable[str] = ALL_TARGETS,
                              seed: int = 0, b_std: float = 0.05) -> dict[str, np.ndarray]:
    """Random lora_A (std 1/sqrt(in)) and lora_B (std b_std; PEFT starts B at zero, which changes
    nothing) for every layer and target of the base model described by config.json `base_config`."""
    shapes = _shapes(base_config)
    tensors = {}
    for layer in range(int(base_config["num_hidden_layers"])):
        for proj in targets:
            fan_in, fan_out = shapes[proj]
            for which, shape, std in (("A", (rank, fan_in), fan_in ** -0.5), ("B", (fan_out, rank), b_std)):
                key = adapter_key(layer, proj, which)
                digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8]
                rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little")))
                tensors[key] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
    return tensors


def write_peft_adapter(directory: Path, tensors: dict[str, np.ndarray], *, rank: int, alpha: float,
                       targets: Iterable[str]) -> Path:
    """adapter_config.json + adapter_model.safetensors in `directory` (created), as PEFT saves a LoRA."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "target_modules": sorted(set(targets)), "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
              "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None, "inference_mode": True}
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n",
                                                   encoding="utf-8")
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    return directory


def _base(base_dir: Path) -> dict:
    try:
        return json.loads((Path(base_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{base_dir}: cannot read the base model's config.json: {exc}", "config.json") from exc


def _publish(staging: Path, base_dir: Path, name: str, engines_root: Path, source: str,
             progress: Progress | None) -> Path:
    architecture = read_manifest(base_dir).architecture     # says which base model the adapter fits
    return publish_artifact(staging, engines_root, name=name, target="lora", source=source,
                            architecture=architecture, progress=progress)


def build_synthetic_adapter(base_dir: Path, name: str, engines_root: Path, *, rank: int = 4, alpha: float = 8.0,
                            targets: Iterable[str] = ALL_TARGETS, seed: int = 0, b_std: float = 0.05,
                            progress: Progress | None = None) -> Path:
    """Publish a random adapter for the base artifact at `base_dir`; returns engines_root/name/<version>."""
    targets = tuple(targets)
    tensors = synthetic_adapter_tensors(_base(base_dir), rank=rank, targets=targets, seed=seed, b_std=b_std)
    with staging_dir(engines_root, name) as staging:
        write_peft_adapter(staging, tensors, rank=rank, alpha=alpha, targets=targets)
        return _publish(staging, base_dir, name, engines_root, f"synthetic-lora:{seed}", progress)


def pack_peft(adapter_dir: Path, base_dir: Path, name: str, engines_root: Path,
              progress: Progress | None = None) -> Path:
    """Copy a PEFT LoRA adapter directory (safetensors) into the artifact store, for the base artifact
    at `base_dir`. Its shapes are checked when the engine loads it."""
    adapter_dir = Path(adapter_dir)
    files = ("adapter_config.json", "adapter_model.safetensors")
    missing = [f for f in files if not (adapter_dir / f).is_file()]
    if missing:
        raise ArtifactError(f"{adapter_dir}: no {missing[0]} (not a PEFT adapter saved with safetensors)", missing[0])
    with staging_dir(engines_root, name) as staging:
        for fname in files:
            shutil.copyfile(adapter_dir / fname, staging / fname)
        return _publish(staging, base_dir, name, engines_root, f"peft:{adapter_dir.name}", progress)
