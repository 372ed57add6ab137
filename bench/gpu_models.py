"""Models for bench/gpu_check.py, made offline: shapes, a Llama-3-sized tokenizer, a dummy-weight artifact, and
a random Hugging Face checkpoint for the parity phase.

- `SHAPES`: "8b" is Llama-3-8B's shape (hidden 4096, 32 layers, 32 heads over 8 KV heads, MLP 14336, vocab
  128256, rope_theta 5e5, untied head); "small" is the CPU stand-in of the same family (GQA, untied).
- `dummy_artifact`: config.json + generation_config.json + tokenizer, published as an artifact with no
  weights; the torch engine's `load_format = "dummy"` makes random weights on the device from its config.
- `sized_tokenizer(vocab)`: exactly `vocab` tokens, so every id a random model samples decodes to text, as
  with the real tokenizer: the 256 byte-level symbols, then multi-byte filler tokens (decoding needs no
  merges; prompts are sent as token ids), then Llama 3's 256 special tokens at the top.
- `parity_checkpoint`: transformers' own random Llama (float32 safetensors) with the same tokenizer.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from inferd.artifacts import ArtifactError
from inferd.artifacts.build.reference import architecture_from_config, pack_hf
from inferd.artifacts.manifest import DefaultSampling, publish_artifact, staging_dir

_NUM_SPECIALS = 256          # Llama 3: <|begin_of_text|> = 128000 ... <|reserved_special_token_247|> = 128255
BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + "
                 "m['content'] + '<|eot_id|>' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 500000.0
    max_position: int = 8192

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token, every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def decode_weight_bytes(self, dtype_bytes: int, batch: int) -> int:
        """Weight bytes a decode step reads: every layer's projections and norms, the final norm and the
        untied LM head in full; of the embedding table only the batch's rows."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        layer = h * h * 2 + h * kv * 2 + 3 * h * self.intermediate + 2 * h
        return (self.layers * layer + h + self.vocab * h + batch * h) * dtype_bytes

    def describe(self) -> str:
        return (f"hidden {self.hidden}, {self.layers} layers, {self.heads}/{self.kv_heads} heads, "
                f"mlp {self.intermediate}, vocab {self.vocab}")


SHAPES = {
    "8b": Shape(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
    "small": Shape(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=1024, max_position=4096),
}


def shape_from(name: str, hidden: int | None = None, layers: int | None = None) -> Shape:
    """A preset with `hidden` (heads keep their head_dim where they can) and `layers` overridden."""
    shape = SHAPES[name]
    if layers:
        shape = replace(shape, layers=layers)
    if hidden:
        heads = max(1, hidden // shape.head_dim)
        kv = max(1, heads * shape.kv_heads // shape.heads)
        shape = replace(shape, hidden=hidden, heads=heads, kv_heads=kv, intermediate=hidden * 7 // 2)
    return shape


def hf_config(shape: Shape, *, dtype: str = "bfloat16") -> dict:
    """A Llama-3-style config.json (transformers 5 layout: rope_theta inside rope_parameters)."""
    first_special = shape.vocab - _NUM_SPECIALS
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": first_special, "eos_token_id": [first_special + 1,
                                                                                      first_special + 9],
            "head_dim": shape.head_dim, "hidden_act": "silu", "hidden_size": shape.hidden,
            "initializer_range": 0.02, "intermediate_size": shape.intermediate,
            "max_position_embeddings": shape.max_position, "mlp_bias": False,
            "num_attention_heads": shape.heads, "num_hidden_layers": shape.layers,
            "num_key_value_heads": shape.kv_heads, "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
            "tie_word_embeddings": False, "dtype": dtype, "vocab_size": shape.vocab}


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-character table (what the ByteLevel decoder maps back to bytes), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


def _special_names() -> list[str]:
    named = {0: BOS, 1: EOS, 6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: EOT}
    return [named.get(i, f"<|reserved_special_token_{i}|>") for i in range(_NUM_SPECIALS)]


def sized_tokenizer(vocab: int, seed: int = 0):
    """A byte-level BPE tokenizer of exactly `vocab` tokens (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if vocab < 256 + _NUM_SPECIALS + 1:
        raise ValueError(f"vocab {vocab} is too small for 256 bytes and {_NUM_SPECIALS} specials")
    symbols = _byte_symbols()
    table = {s: i for i, s in enumerate(symbols)}
    letters = symbols[ord("a"):ord("z") + 1] + symbols[ord("A"):ord("Z") + 1]
    space = symbols[ord(" ")]
    rng = random.Random(seed)
    while len(table) < vocab - _NUM_SPECIALS:
        word = "".join(rng.choices(letters, k=rng.randint(2, 8)))
        table.setdefault(space + word if rng.random() < 0.6 else word, len(table))
    tokenizer = Tokenizer(models.BPE(vocab=table, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(_special_names())
    if tokenizer.get_vocab_size() != vocab:
        raise ArtifactError(f"the tokenizer came out with {tokenizer.get_vocab_size()} tokens, not {vocab}")
    return tokenizer


def write_tokenizer(directory: Path, vocab: int) -> None:
    tokenizer = sized_tokenizer(vocab)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOT, "chat_template": CHAT_TEMPLATE,
              "clean_up_tokenization_spaces": False, "model_max_length": 8192,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def dummy_artifact(engines_root: Path, name: str, shape: Shape) -> Path:
    """engines_root/name/<version>: config + tokenizer, no weights (load_format = "dummy"). Idempotent."""
    config = hf_config(shape)
    with staging_dir(engines_root, name) as staging:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
        (staging / "generation_config.json").write_text(json.dumps(generation) + "\n", encoding="utf-8")
        write_tokenizer(staging, shape.vocab)
        params = shape.decode_weight_bytes(1, 0) + shape.vocab * shape.hidden
        return publish_artifact(staging, engines_root, name=name, target="reference", source="dummy:" + name,
                                architecture=architecture_from_config(config, params),
                                sampling=DefaultSampling(temperature=0.0), build={"shape": json.dumps(asdict(shape))},
                                progress=lambda _message: None)


def parity_checkpoint(directory: Path, engines_root: Path, name: str, shape: Shape, seed: int = 0):
    """A random transformers Llama of `shape` saved in float32 under `directory` and packed as an artifact.
    Returns (the float32 transformers model on the CPU, eval mode; the artifact's path)."""
    import torch
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    config = hf_config(shape, dtype="float32")
    config["initializer_range"] = 0.1      # larger than 0.02: logits with a spread, fewer near-ties in greedy
    hf = transformers.AutoConfig.for_model("llama", **{k: v for k, v in config.items()
                                                       if k not in ("architectures", "model_type")})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf).float().eval()
    model.save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory, shape.vocab)
    artifact = pack_hf(directory, name, engines_root, progress=lambda _message: None)
    return model, artifact
