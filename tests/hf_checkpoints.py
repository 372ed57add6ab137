"""Random tiny Hugging Face checkpoints shaped like the model families people start with (a shared fixture).

`save_checkpoint(directory, family)` writes what a hub repo of that family holds: config.json and
generation_config.json and model.safetensors from transformers' own `AutoModelForCausalLM.from_config` +
`save_pretrained(safe_serialization=True)`, plus a small byte-level tokenizer.json (token id b is byte b, so
a served token's bytes name its id) with a ChatML template.
It returns the transformers model (float32, eval) for parity checks. Shapes are tiny (hidden 64, 2 layers)
so a checkpoint is made and saved in well under a second.

Families (FAMILIES), each keeping what distinguishes the real checkpoints:
- "tinyllama": Llama, grouped-query attention (4 heads over 2 KV heads), untied LM head.
- "smollm2":   Llama, tie_word_embeddings (SmolLM2-135M/360M).
- "llama3":    Llama 3.x: rope_scaling rope_type "llama3", rope_theta 5e5, tied (Llama 3.2 1B).
- "qwen2":     Qwen2: biases on q/k/v (not o_proj), untied.
- "qwen2.5":   Qwen2.5 small: as qwen2 with tied embeddings, rope_theta 1e6, sliding window configured but off.
- "qwen3":     Qwen3: q_norm/k_norm per head before RoPE, head_dim 32 != hidden/heads 16, no biases, tied.

transformers initializes biases to 0 and norm weights to 1; the saved checkpoint perturbs every bias and
norm weight, so a forward pass that dropped a bias or a q/k norm would not match by accident.
Needs torch and transformers 5 (the `parity` extra): importing this module skips the test module without them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402  (after the skips)

# The tokenizer: the 256 byte-level symbols, then the specials Qwen2.5 and SmolLM2 use (ChatML).
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = (ENDOFTEXT, IM_START, IM_END)
TOKENIZER_SIZE = 256 + len(SPECIALS)
VOCAB = 320              # padded past the tokenizer, as Qwen's 151936 embedding rows exceed its 151665 tokens
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

BASE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.15, rms_norm_eps=1e-6,
    bos_token_id=256, eos_token_id=258, pad_token_id=256)   # <|endoftext|>, <|im_end|> (ids below)

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}

# family -> (model_type, config fields over BASE)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "tinyllama": ("llama", dict(tie_word_embeddings=False, rms_norm_eps=1e-5)),
    "smollm2": ("llama", dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                         "rope_theta": 100000.0})),
    "llama3": ("llama", dict(tie_word_embeddings=True, rope_parameters={"rope_theta": 500000.0, **LLAMA3_ROPE})),
    "qwen2": ("qwen2", dict(tie_word_embeddings=False)),
    "qwen2.5": ("qwen2", dict(tie_word_embeddings=True, use_sliding_window=False, sliding_window=128,
                              max_window_layers=1, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3": ("qwen3", dict(tie_word_embeddings=True, head_dim=32, attention_bias=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}


def hf_config(family: str, **overrides: Any):
    """transformers' config object for `family`, with `overrides` over its fields."""
    model_type, fields = FAMILIES[family]
    return transformers.AutoConfig.for_model(model_type, **{**BASE, **fields, **overrides})


def save_checkpoint(directory: Path, family: str, *, seed: int = 0, dtype=None, max_shard_size: str | None = None,
                    **overrides: Any):
    """A random `family` checkpoint saved into `directory` (created) as a hub repo holds it; returns the
    float32 transformers model. `dtype` (e.g. torch.bfloat16) is the dtype saved; `max_shard_size` shards."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(family, **overrides)).eval()
    _perturb_biases_and_norms(model, seed)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.to(dtype or torch.float32).save_pretrained(directory, safe_serialization=True, **kwargs)
    write_tokenizer(directory)
    return model.float()


def _perturb_biases_and_norms(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
            elif "norm" in name:
                param.copy_(1.0 + torch.randn(param.shape, generator=generator) * 0.3)


def byte_level_tokenizer() -> Tokenizer:
    """Byte-level BPE with no merges: token id b is byte b (0-255), then SPECIALS (256-258). Built, not trained."""
    tokenizer = Tokenizer(models.BPE(vocab={symbol: b for b, symbol in enumerate(_byte_symbols())}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIALS))
    return tokenizer


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-character table (what ByteLevel pre-tokenizes into), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


def write_tokenizer(directory: Path) -> None:
    """tokenizer.json + tokenizer_config.json (Qwen2.5's layout: no BOS, EOS <|im_end|>, ChatML template)."""
    directory = Path(directory)
    tokenizer = byte_level_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    added = {str(tokenizer.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                            "single_word": False, "special": True} for t in SPECIALS}
    config = {"added_tokens_decoder": added, "bos_token": None, "eos_token": IM_END, "pad_token": ENDOFTEXT,
              "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False, "model_max_length": 256,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
