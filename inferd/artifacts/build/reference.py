"""Artifacts for the reference (NumPy) engine: HF-layout Llama-family checkpoints (Llama, Qwen2, Qwen3).

- `build_synthetic(kind, engines_root)` for a kind of SYNTHETIC_SPECS ("tiny", "small"; the embedding
  models "tiny-embed", "embed"): deterministic random weights plus a real byte-level BPE tokenizer
  trained here; rebuilding gives byte-identical files and the same version. An embedding kind's
  manifest has an `[embedding]` table; with last-token pooling its tokenizer also appends EOS, the
  token whose state is the embedding (as gte-Qwen's tokenizer does).
- `pack_hf(hf_dir, name, engines_root, source=, revision=)`: copy an existing HF checkpoint of
  SUPPORTED_ARCHITECTURES into an artifact; a pulled one (inferd.artifacts.hub) records its hub id and commit.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import msgspec
import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, processors

from inferd.artifacts.build.tokenizer_train import (
    BOS_TOKEN,
    EOS_TOKEN,
    IM_END,
    PAD_TOKEN,
    train_byte_level_bpe,
    write_tokenizer_files,
)
from inferd.artifacts.manifest import (
    Architecture,
    ArtifactError,
    DefaultSampling,
    EmbeddingSpec,
    Progress,
    publish_artifact,
    staging_dir,
)

# What the reference engine's decoder runs (inferd/engine/reference/config.py checks the details at load).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# config.json's quantization_config.quant_method of an int8 weight-only version (inferd.engine.reference.quantize):
# what a footprint estimate reads, and what the TensorRT-LLM build refuses as a source.
INT8_QUANT_METHOD = "inferd_int8_weight_only"
_HF_OPTIONAL_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                      "chat_template.jinja", "model.safetensors.index.json")


class SyntheticSpec(msgspec.Struct, frozen=True, kw_only=True):
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    tie_word_embeddings: bool
    corpus_lines: int          # tokenizer training corpus size
    seed: int = 0
    embedding: EmbeddingSpec | None = None    # an embedding model (None: a generative one)


SYNTHETIC_SPECS = {
    # Loads in milliseconds; what the test suite runs on. Untied, so lm_head is exercised too.
    "tiny": SyntheticSpec(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                          intermediate_size=128, max_position_embeddings=512, rope_theta=10000.0,
                          tie_word_embeddings=False, corpus_lines=2000),
    # ~28M parameters, Llama-3-shaped (GQA, tied embeddings, rope_theta 5e5).
    "small": SyntheticSpec(vocab_size=8192, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4,
                           intermediate_size=1408, max_position_embeddings=2048, rope_theta=500000.0,
                           tie_word_embeddings=True, corpus_lines=30000),
    # Embedding models, pooled from the final hidden states. For tests, shaped like "tiny":
    "tiny-embed": SyntheticSpec(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                intermediate_size=128, max_position_embeddings=512, rope_theta=10000.0,
                                tie_word_embeddings=False, corpus_lines=2000,
                                embedding=EmbeddingSpec(pooling="last", matryoshka_min_dimensions=16)),
    # ~13M parameters, 384-wide like the small sentence embedders; builds in a few seconds.
    "embed": SyntheticSpec(vocab_size=8192, hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2,
                           intermediate_size=1024, max_position_embeddings=512, rope_theta=10000.0,
                           tie_word_embeddings=True, corpus_lines=30000,
                           embedding=EmbeddingSpec(pooling="mean", matryoshka_min_dimensions=64)),
}


def _stderr_progress(message: str) -> None:
    print(f"[build] {message}", file=sys.stderr, flush=True)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _tensor_shapes(spec: SyntheticSpec) -> dict[str, tuple[int, ...]]:
    h, hd = spec.hidden_size, spec.hidden_size // spec.num_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (spec.num_heads * hd, h),
            p + "self_attn.k_proj.weight": (spec.num_kv_heads * hd, h),
            p + "self_attn.v_proj.weight": (spec.num_kv_heads * hd, h),
            p + "self_attn.o_proj.weight": (h, spec.num_heads * hd),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (spec.intermediate_size, h),
            p + "mlp.up_proj.weight": (spec.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, spec.intermediate_size),
        })
    shapes["model.norm.weight"] = (h,)
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


def num_parameters(spec: SyntheticSpec) -> int:
    return sum(int(np.prod(shape)) for shape in _tensor_shapes(spec).values())


def _tensor_std(name: str, spec: SyntheticSpec) -> float:
    # Plain N(0, 0.02) everywhere makes a tied-embedding model echo its input token forever: the
    # residual stream is dominated by the token's own embedding. Larger q/k give attention
    # some shape, and larger output projections let the layers outweigh the embedding.
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        return 1.0 / spec.hidden_size ** 0.5 * 2.0
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return 0.06
    return 0.02


def random_weights(spec: SyntheticSpec) -> dict[str, np.ndarray]:
    """Each tensor gets its own PRNG seeded from (seed, name): order-independent and reproducible."""
    tensors = {}
    for name, shape in _tensor_shapes(spec).items():
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, dtype=np.float32)
            continue
        seed = int.from_bytes(hashlib.sha256(f"{spec.seed}:{name}".encode()).digest()[:8], "little")
        rng = np.random.Generator(np.random.PCG64(seed))
        tensors[name] = (rng.standard_normal(shape, dtype=np.float32) * _tensor_std(name, spec)).astype(np.float32)
    return tensors


def _append_eos(tokenizer: Tokenizer) -> None:
    """Post-process as BOS ... EOS, so a last-token-pooling embedder pools the state at EOS."""
    bos, eos = (tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A {EOS_TOKEN}", pair=f"{BOS_TOKEN} $A $B {EOS_TOKEN}",
        special_tokens=[(BOS_TOKEN, bos), (EOS_TOKEN, eos)])


def _llama_config(spec: SyntheticSpec, bos_id: int, eos_ids: list[int]) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "head_dim": spec.hidden_size // spec.num_heads,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "mlp_bias": False,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.num_kv_heads,
        "rms_norm_eps": 1e-5,
        "rope_scaling": None,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "dtype": "float32",
        "vocab_size": spec.vocab_size,
    }


def architecture_from_config(config: dict, num_params: int | None = None) -> Architecture:
    """Summarize an HF config.json; raises ArtifactError naming a missing or odd field.

    Defaults are transformers': Qwen3's head_dim is 128 when absent (not hidden/heads), and transformers 5
    writes rope_theta inside `rope_parameters` (4.x at the top level, beside `rope_scaling`)."""
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        model_type = str(config.get("model_type", "llama"))
        rope = config.get("rope_parameters") or {}
        arch = Architecture(
            architecture=config["architectures"][0],
            model_type=model_type,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or (128 if model_type == "qwen3" else hidden // heads)),
            intermediate_size=int(config["intermediate_size"]),
            max_position_embeddings=int(config["max_position_embeddings"]),
            rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            dtype=str(config.get("dtype") or config.get("torch_dtype") or "unknown"),
            num_parameters=num_params if num_params is not None else -1,
        )
    except KeyError as exc:
        raise ArtifactError(f"config.json lacks {exc.args[0]}", "config.json") from exc
    except (TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ArtifactError(f"config.json has a malformed field: {exc}", "config.json") from exc
    return arch


def _count_checkpoint_parameters(files: list[Path]) -> int:
    """Sum of tensor sizes from safetensors headers (8-byte length + JSON); reads no weights."""
    total = 0
    for path in files:
        with open(path, "rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(header_len)) if 0 < header_len < 100_000_000 else None
        if not isinstance(header, dict):
            raise ArtifactError(f"{path.name}: not a safetensors file", path.name)
        total += sum(int(np.prod(meta["shape"])) for key, meta in header.items() if key != "__metadata__")
    return total


def sampling_from_generation_config(generation: dict) -> DefaultSampling:
    """A checkpoint's generation_config.json as manifest sampling defaults (do_sample false = greedy)."""
    if generation.get("do_sample") is False:
        return DefaultSampling(temperature=0.0)
    return DefaultSampling(temperature=float(generation.get("temperature", 1.0)),
                           top_p=float(generation.get("top_p", 1.0)), top_k=int(generation.get("top_k", 0) or 0))


def build_synthetic(kind: str, engines_root: Path, progress: Progress | None = None) -> Path:
    """Build (or find, if identical content exists) engines/<kind>/<version>; returns its path."""
    if kind not in SYNTHETIC_SPECS:
        raise ValueError(f"unknown synthetic model {kind!r}; choose from {', '.join(SYNTHETIC_SPECS)}")
    spec = SYNTHETIC_SPECS[kind]
    say = progress or _stderr_progress
    say(f"{kind}: training byte-level BPE tokenizer (vocab {spec.vocab_size}, {spec.corpus_lines} lines)")
    tokenizer = train_byte_level_bpe(spec.vocab_size, num_lines=spec.corpus_lines, seed=spec.seed)
    if tokenizer.get_vocab_size() != spec.vocab_size:
        raise ArtifactError(f"tokenizer training reached {tokenizer.get_vocab_size()} tokens, "
                            f"not {spec.vocab_size}; enlarge the corpus")
    if spec.embedding is not None and spec.embedding.pooling == "last":
        _append_eos(tokenizer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    eos_ids = [tokenizer.token_to_id(EOS_TOKEN), tokenizer.token_to_id(IM_END)]
    n_params = num_parameters(spec)
    with staging_dir(engines_root, kind) as staging:
        write_tokenizer_files(staging, tokenizer, model_max_length=spec.max_position_embeddings)
        config = _llama_config(spec, bos_id, eos_ids)
        _write_json(staging / "config.json", config)
        generation = {"bos_token_id": bos_id, "eos_token_id": eos_ids, "pad_token_id": tokenizer.token_to_id(PAD_TOKEN),
                      "do_sample": True, "temperature": 1.0, "top_p": 1.0}
        _write_json(staging / "generation_config.json", generation)
        say(f"{kind}: generating {n_params / 1e6:.1f}M random float32 parameters")
        # Fixed metadata; safetensors orders tensors deterministically, so the file is byte-stable.
        save_file(random_weights(spec), str(staging / "model.safetensors"), metadata={"format": "pt"})
        say(f"{kind}: hashing and publishing")
        path = publish_artifact(staging, engines_root, name=kind, target="reference", source=f"synthetic:{kind}",
                                architecture=architecture_from_config(config, n_params),
                                sampling=sampling_from_generation_config(generation), embedding=spec.embedding,
                                progress=say)
    say(f"{kind}: ready at {path}")
    return path


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object; ArtifactError names the file otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: not valid JSON: {exc}", path.name) from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object", path.name)
    return data


def _weight_files(hf_dir: Path) -> list[str]:
    """The shards the index names (repos may also ship e.g. consolidated.safetensors), else all."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ArtifactError(f"{index}: no weight_map", index.name)
        missing = sorted(f for f in set(weight_map.values()) if not (hf_dir / f).is_file())
        if missing:
            raise ArtifactError(f"{hf_dir}: {missing[0]} is named by the index but missing", missing[0])
        return sorted(set(weight_map.values()))
    return sorted(p.name for p in hf_dir.glob("*.safetensors"))


def pack_hf(hf_dir: Path, name: str, engines_root: Path, progress: Progress | None = None, *,
            source: str | None = None, revision: str | None = None) -> Path:
    """Copy an HF Llama-family checkpoint (safetensors + fast tokenizer) into an artifact. `source` (default
    "hf:<dir name>") and `revision` (the hub commit it was pulled at) go into the manifest as they are."""
    hf_dir, say = Path(hf_dir), progress or _stderr_progress
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        raise ArtifactError(f"{hf_dir}: no config.json (not a Hugging Face checkpoint directory)", "config.json")
    config = read_json_object(config_path)
    architectures = config.get("architectures")
    if not architectures or architectures[0] not in SUPPORTED_ARCHITECTURES:
        raise ArtifactError(f"{config_path}: architectures = {architectures!r}; the reference target runs "
                            f"only {', '.join(SUPPORTED_ARCHITECTURES)}", "config.json")
    weights = _weight_files(hf_dir)
    if not weights:
        raise ArtifactError(f"{hf_dir}: no *.safetensors weights (convert .bin checkpoints to safetensors first)")
    if not (hf_dir / "tokenizer.json").is_file():
        raise ArtifactError(f"{hf_dir}: no tokenizer.json (a fast tokenizer is required)", "tokenizer.json")
    files = ["config.json", "tokenizer.json", *weights,
             *(f for f in _HF_OPTIONAL_FILES if (hf_dir / f).is_file())]
    generation = read_json_object(hf_dir / "generation_config.json") if (
        hf_dir / "generation_config.json").is_file() else {}
    with staging_dir(engines_root, name) as staging:
        for fname in files:
            say(f"{name}: copying {fname} ({(hf_dir / fname).stat().st_size / 1e6:.1f} MB)")
            shutil.copyfile(hf_dir / fname, staging / fname)
        path = publish_artifact(staging, engines_root, name=name, target="reference",
                                source=source or f"hf:{hf_dir.name}", revision=revision,
                                architecture=architecture_from_config(
                                    config, _count_checkpoint_parameters([hf_dir / w for w in weights])),
                                sampling=sampling_from_generation_config(generation), progress=say)
    say(f"{name}: ready at {path}")
    return path
