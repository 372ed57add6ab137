"""A synthetic model that copies: what speculative decoding's tests and benchmark need from a real model.

A random model's output is noise that never repeats, so nothing a prompt lookup drafts is ever kept,
while a real model editing code or summarizing a document copies spans of its prompt. `build_copying`
makes a model of a synthetic kind's shapes (same layers, same cost per step) whose greedy next token is
a fixed successor of the current one: `successor`, one cycle through the whole vocabulary. Its output from
a token that appears in the prompt reproduces the span that followed it there (and never repeats itself
within a vocabulary's length otherwise).

How: the LM head's row for token y is the embedding of y's predecessor, so the logits peak at the
successor of the token the residual stream is dominated by, its own embedding; the layers' output
projections are small enough not to move that peak (about 18 standard deviations clear at "small").
Sampling at temperature 1 follows the successor most of the time, not always.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import msgspec
import numpy as np
from safetensors.numpy import save_file

from inferd.artifacts.build.reference import SYNTHETIC_SPECS, SyntheticSpec, build_synthetic, pack_hf, random_weights
from inferd.artifacts.manifest import Progress

_COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
OUTPUT_STD = 0.002        # the attention and MLP output projections (the plain synthetic kinds: 0.06)


def successor_cycle(vocab_size: int, seed: int = 0) -> np.ndarray:
    """successor[t]: the token after t, one cycle through all `vocab_size` tokens."""
    order = np.random.default_rng(seed).permutation(vocab_size)
    successor = np.empty(vocab_size, dtype=np.int64)
    successor[order] = np.roll(order, -1)
    return successor


def draft_spec(kind: str) -> SyntheticSpec:
    """A quarter of `kind`'s width, one layer: a draft model for it (same vocabulary and tokenizer)."""
    spec = SYNTHETIC_SPECS[kind]
    return msgspec.structs.replace(spec, hidden_size=spec.hidden_size // 4, num_layers=1,
                                   num_heads=max(1, spec.num_heads // 4), num_kv_heads=1,
                                   intermediate_size=spec.intermediate_size // 4, seed=spec.seed + 7)


def copying_weights(spec: SyntheticSpec, successor: np.ndarray) -> dict[str, np.ndarray]:
    tensors = random_weights(spec)
    rng = np.random.default_rng(spec.seed + 1)
    embed = rng.standard_normal((spec.vocab_size, spec.hidden_size), dtype=np.float32)
    embed /= np.linalg.norm(embed, axis=1, keepdims=True)
    tensors["model.embed_tokens.weight"] = embed
    predecessor = np.empty_like(successor)
    predecessor[successor] = np.arange(successor.shape[0])
    tensors["lm_head.weight"] = np.ascontiguousarray(embed[predecessor])
    for name, tensor in tensors.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = (tensor / tensor.std() * OUTPUT_STD).astype(np.float32)
    return tensors


def build_copying(kind: str, engines_root: Path, progress: Progress | None = None, *,
                  seed: int = 0, draft: bool = False) -> tuple[Path, np.ndarray]:
    """engines/<kind>-copy/<version>: the synthetic `kind`'s shapes and tokenizer, an untied LM head, and
    weights that continue each token with successor[token]. Returns (its path, successor). `draft`: the
    same successor and tokenizer in a model a quarter as wide with one layer (draft_spec), as
    engines/<kind>-copy-draft: it agrees with the full one less often when sampling (a flatter distribution)."""
    say = progress or (lambda message: None)
    spec = draft_spec(kind) if draft else SYNTHETIC_SPECS[kind]
    name = f"{kind}-copy-draft" if draft else f"{kind}-copy"
    successor = successor_cycle(spec.vocab_size, seed)
    with tempfile.TemporaryDirectory(prefix="inferd-copying-") as tmp:
        base = build_synthetic(kind, Path(tmp) / "engines", progress=say)
        hf_dir = Path(tmp) / f"{kind}-copy"
        hf_dir.mkdir()
        for file in _COPIED_FILES:
            if (base / file).is_file():
                shutil.copyfile(base / file, hf_dir / file)
        config = json.loads((base / "config.json").read_text())
        config.update(tie_word_embeddings=False, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
                      num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
                      intermediate_size=spec.intermediate_size)
        config.pop("head_dim", None)
        (hf_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(copying_weights(spec, successor), str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
        path = pack_hf(hf_dir, name, engines_root, progress=say, source=f"synthetic:{name}")
    return path, successor
