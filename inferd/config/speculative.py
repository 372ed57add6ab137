"""`[models.<name>.speculative]`: speculative decoding for one model (docs/speculative.md).

The reference and torch engines draft by prompt lookup ("ngram").
"""
from __future__ import annotations

from typing import Literal

from inferd.config.walk import ConfigTable

SpeculativeMethod = Literal["ngram"]
MAX_SPECULATIVE_TOKENS = 16          # vLLM and TensorRT-LLM run 1-8 in practice; more is mostly wasted work


class SpeculativeConfig(ConfigTable):
    method: SpeculativeMethod = "ngram"
    num_speculative_tokens: int = 4       # drafts verified per step, at most (vLLM's num_speculative_tokens)
    # prompt lookup: the longest suffix of min..max tokens that occurred earlier proposes what followed it
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4


def speculative_errors(path: str, backend: str, table: SpeculativeConfig | None) -> list[str]:
    """Problems of one model's [speculative] table, each as `path.key: problem`."""
    if table is None:
        return []
    p = f"{path}.speculative"
    errors = []
    if backend not in ("reference", "torch"):
        errors.append(f"{p}: speculative decoding runs on the reference and torch backends (backend is "
                      f"{backend!r})")
    if not 1 <= table.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
        errors.append(f"{p}.num_speculative_tokens: must be in [1, {MAX_SPECULATIVE_TOKENS}], "
                      f"got {table.num_speculative_tokens}")
    if not 1 <= table.prompt_lookup_min <= table.prompt_lookup_max:
        errors.append(f"{p}.prompt_lookup_min: need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                      f"{table.prompt_lookup_min} and {table.prompt_lookup_max}")
    return errors
