"""LoRA adapters in PEFT's format, read for one base model, and their low-rank deltas inside a batched step.

An adapter directory holds `adapter_config.json` (`r`, `lora_alpha`, `target_modules`, ...) and
`adapter_model.safetensors` with `base_model.model.model.layers.N.{self_attn,mlp}.P.lora_A.weight`
([r, in]) and `.lora_B.weight` ([out, r]) for P among q/k/v/o_proj and gate/up/down_proj. A targeted
projection computes `x @ W^T + (x @ A^T @ B^T) * scaling`, scaling = lora_alpha / r (or / sqrt(r) with
`use_rslora`), as PEFT does. Every tensor is checked against the base model's shapes at load; a
mismatch is an AdapterLoadError naming the file and the tensor.

In a step, the base projection runs once over the whole batch; `lora_groups` then gathers the rows of
each distinct adapter, and `LoraWeights.add` adds that adapter's delta to those rows only. The model
fuses q/k/v and gate/up, so an adapter's A matrices for one fused projection are stacked (one
`x @ A^T` per site) and each B writes its own column range of the fused output.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferd.artifacts import sha256_file
from inferd.engine.adapters import AdapterLoadError
from inferd.engine.reference.weights import Checkpoint, WeightsError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# projection -> (its module in a layer, the model's fused site, its part of the site in order)
PROJECTIONS = {
    "q_proj": ("self_attn", "qkv", 0), "k_proj": ("self_attn", "qkv", 1), "v_proj": ("self_attn", "qkv", 2),
    "o_proj": ("self_attn", "o", 0),
    "gate_proj": ("mlp", "gate_up", 0), "up_proj": ("mlp", "gate_up", 1), "down_proj": ("mlp", "down", 0),
}
_KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")
# adapter_config.json settings this engine does not apply (refused unless unset, false, empty or "none")
_UNSUPPORTED = ("use_dora", "fan_in_fan_out", "lora_bias", "bias", "modules_to_save", "rank_pattern",
                "alpha_pattern", "trainable_token_indices", "layer_replication")


def projection_shapes(config) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each LoRA-able projection of a LlamaConfig."""
    h, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


class _Site:
    """One adapter's delta on one fused projection of one layer."""

    __slots__ = ("a", "parts")

    def __init__(self, a: np.ndarray, parts: list[tuple[slice, slice, np.ndarray]]) -> None:
        self.a = a            # [in, sum of ranks]: the A^T of each targeted part, side by side
        self.parts = parts    # (its columns of x @ a, its output columns, B^T * scaling [r, out])

    def add(self, x: np.ndarray, y: np.ndarray, rows: slice | np.ndarray) -> None:
        xa = x[rows] @ self.a
        for r_cols, out_cols, b in self.parts:
            y[rows, out_cols] += xa[:, r_cols] @ b


@dataclass(frozen=True, eq=False)
class LoraWeights:
    """A loaded adapter: per layer, the sites ("qkv", "o", "gate_up", "down") it changes."""

    name: str
    rank: int
    scaling: float
    targets: tuple[str, ...]               # projections with tensors, sorted
    layers: tuple[dict[str, _Site], ...]
    nbytes: int
    fingerprint: bytes                     # sha256 of its files: what a sequence's prefix-cache salt takes in
    version: str | None = None             # the artifact version, when verified against a manifest

    def add(self, layer: int, site: str, x: np.ndarray, y: np.ndarray, rows: slice | np.ndarray) -> None:
        """y[rows] += this adapter's delta at `site` of `layer` for inputs x (x[rows] are its rows)."""
        s = self.layers[layer].get(site)
        if s is not None:
            s.add(x, y, rows)


def lora_groups(adapters: Sequence[LoraWeights | None] | None,
                query_lens: Sequence[int]) -> list[tuple[LoraWeights, slice | np.ndarray]]:
    """Each distinct adapter of a step with the packed rows of its sequences (a slice when they are one
    run). `adapters[i]` belongs to sequence i; sequences without one get no delta."""
    if not adapters or all(a is None for a in adapters):
        return []
    runs: dict[int, tuple[LoraWeights, list[list[int]]]] = {}
    start = 0
    for adapter, n in zip(adapters, query_lens):
        if adapter is not None:
            spans = runs.setdefault(id(adapter), (adapter, []))[1]
            if spans and spans[-1][1] == start:
                spans[-1][1] = start + n
            else:
                spans.append([start, start + n])
        start += n
    return [(adapter, slice(*spans[0]) if len(spans) == 1 else
             np.concatenate([np.arange(a, b) for a, b in spans]))
            for adapter, spans in runs.values()]


def _fail(name: str, message: str, file: str | None = None, tensor: str | None = None) -> AdapterLoadError:
    return AdapterLoadError(f"LoRA adapter {name!r}: {message}", name, file, tensor)


def read_adapter_config(name: str, directory: Path) -> tuple[int, float, object]:
    """(r, scaling, target_modules) from adapter_config.json; AdapterLoadError for what this engine
    cannot apply."""
    path = directory / CONFIG_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(name, f"{path} is missing (not a PEFT adapter directory)", CONFIG_FILE) from None
    except (OSError, ValueError) as exc:
        raise _fail(name, f"{path} is not readable JSON: {exc}", CONFIG_FILE) from exc
    if not isinstance(raw, dict):
        raise _fail(name, f"{path} must hold a JSON object", CONFIG_FILE)
    if raw.get("peft_type", "LORA") != "LORA":
        raise _fail(name, f"{path}: peft_type {raw['peft_type']!r} is not supported (only 'LORA')", CONFIG_FILE)
    for key in _UNSUPPORTED:
        if raw.get(key) and raw[key] != "none":   # false, null, {}, [] and "none" mean "not used"
            raise _fail(name, f"{path}: {key} = {raw[key]!r} is not supported by the reference engine", CONFIG_FILE)
    rank, alpha = raw.get("r"), raw.get("lora_alpha", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise _fail(name, f"{path}: r must be a positive integer, got {rank!r}", CONFIG_FILE)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise _fail(name, f"{path}: lora_alpha must be a positive number, got {alpha!r}", CONFIG_FILE)
    scaling = alpha / rank ** 0.5 if raw.get("use_rslora") else alpha / rank
    return rank, float(scaling), raw.get("target_modules")


def load_lora(name: str, directory: Path, model_config, version: str | None = None) -> LoraWeights:
    """Read and check a PEFT LoRA adapter for a base model with LlamaConfig `model_config`."""
    directory = Path(directory)
    rank, scaling, target_modules = read_adapter_config(name, directory)
    if not (directory / WEIGHTS_FILE).is_file():
        raise _fail(name, f"{directory / WEIGHTS_FILE} is missing (adapter_model.bin is not supported: "
                          "save with safe_serialization)", WEIGHTS_FILE)
    try:
        checkpoint = Checkpoint(directory, files=[directory / WEIGHTS_FILE])
    except WeightsError as exc:
        raise _fail(name, str(exc), WEIGHTS_FILE) from exc
    shapes = projection_shapes(model_config)
    num_layers = model_config.num_hidden_layers
    found: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key in checkpoint:
        m = _KEY.fullmatch(key)
        if m is None or m[3] not in PROJECTIONS or PROJECTIONS[m[3]][0] != m[2]:
            raise _fail(name, f"{WEIGHTS_FILE}: tensor {key!r} is not a LoRA A/B matrix of a q/k/v/o or "
                              "gate/up/down projection", WEIGHTS_FILE, key)
        layer, proj, which = int(m[1]), m[3], m[4]
        if layer >= num_layers:
            raise _fail(name, f"{WEIGHTS_FILE}: tensor {key!r} is for layer {layer}; the base model has "
                              f"{num_layers} layers", WEIGHTS_FILE, key)
        fan_in, fan_out = shapes[proj]
        expected = (rank, fan_in) if which == "A" else (fan_out, rank)
        if checkpoint.shape(key) != expected:
            raise _fail(name, f"{WEIGHTS_FILE}: tensor {key!r} has shape {checkpoint.shape(key)}; with r = {rank} "
                              f"and this base model it must be {expected}", WEIGHTS_FILE, key)
        try:
            found.setdefault((layer, proj), {})[which] = checkpoint.get(key)
        except WeightsError as exc:
            raise _fail(name, str(exc), WEIGHTS_FILE, key) from exc
    for (layer, proj), pair in sorted(found.items()):
        if len(pair) != 2:
            missing = "lora_B" if "A" in pair else "lora_A"
            key = f"base_model.model.model.layers.{layer}.{PROJECTIONS[proj][0]}.{proj}.{missing}.weight"
            raise _fail(name, f"{WEIGHTS_FILE} lacks tensor {key!r} (its pair is there)", WEIGHTS_FILE, key)
    targets = tuple(sorted({proj for _, proj in found}))
    if not targets:
        raise _fail(name, f"{WEIGHTS_FILE} holds no LoRA tensors", WEIGHTS_FILE)
    if isinstance(target_modules, list):
        named = {str(t).rpartition(".")[2] for t in target_modules}
        unapplied = sorted(named - set(targets))
        if unapplied:
            raise _fail(name, f"{CONFIG_FILE} targets {', '.join(unapplied)}, which {WEIGHTS_FILE} has no tensors "
                              "for (or this engine cannot apply)", CONFIG_FILE)
    return _assemble(name, rank, scaling, targets, found, shapes, num_layers, version, _fingerprint(directory))


def _fingerprint(directory: Path) -> bytes:
    """sha256 over the adapter's two files: a reload of changed files never meets KV of the old ones."""
    digest = hashlib.sha256()
    for fname in (CONFIG_FILE, WEIGHTS_FILE):
        digest.update(f"{fname}\0{sha256_file(directory / fname)}\n".encode())
    return digest.digest()


def _assemble(name: str, rank: int, scaling: float, targets: tuple[str, ...],
              found: dict[tuple[int, str], dict[str, np.ndarray]], shapes: dict[str, tuple[int, int]],
              num_layers: int, version: str | None, fingerprint: bytes) -> LoraWeights:
    """Stack each fused site's A^T side by side and pre-scale its B^T (float32, contiguous)."""
    offsets: dict[str, int] = {}                 # each projection's first column in its fused output
    for proj, (_, site, part) in PROJECTIONS.items():
        offsets[proj] = sum(shapes[p][1] for p, (_, s, q) in PROJECTIONS.items() if s == site and q < part)
    layers: list[dict[str, _Site]] = []
    nbytes = 0
    scale = np.float32(scaling)
    for layer in range(num_layers):
        by_site: dict[str, list[str]] = {}
        for proj in sorted(targets, key=lambda p: PROJECTIONS[p][2]):
            if (layer, proj) in found:
                by_site.setdefault(PROJECTIONS[proj][1], []).append(proj)
        sites: dict[str, _Site] = {}
        for site, projs in by_site.items():
            a = np.ascontiguousarray(np.concatenate([found[layer, p]["A"] for p in projs]).T)
            parts = [(slice(i * rank, (i + 1) * rank), slice(offsets[p], offsets[p] + shapes[p][1]),
                      np.ascontiguousarray(found[layer, p]["B"].T * scale)) for i, p in enumerate(projs)]
            sites[site] = _Site(a, parts)
            nbytes += a.nbytes + sum(part[2].nbytes for part in parts)
        layers.append(sites)
    return LoraWeights(name=name, rank=rank, scaling=scaling, targets=targets, layers=tuple(layers),
                       nbytes=nbytes, fingerprint=fingerprint, version=version)
