"""`[models.<name>.speculative]`: speculative decoding for one model (docs/speculative.md).

The reference and torch engines draft by prompt lookup ("ngram"); the reference engine also with a draft
model ("draft_model": a smaller artifact of the same tokenizer). The sim models speculation's step times from
an `acceptance_rate` (inferd.engine.sim.speculation), for capacity planning and load tests.
"""
from __future__ import annotations

from typing import Literal

from inferd.config.walk import ConfigTable

SpeculativeMethod = Literal["ngram", "draft_model", "eagle"]
# What TensorRT-LLM's TensorRT backend runs (llmapi/llm_args.py@fcd3f316 `supports_backend`: NGram and
# Draft_Target speculation are its PyTorch backend's only): EAGLE, from an engine built with it.
TRTLLM_METHODS = ("eagle",)
MAX_SPECULATIVE_TOKENS = 16          # vLLM and TensorRT-LLM run 1-8 in practice; more is mostly wasted work


class SpeculativeConfig(ConfigTable):
    method: SpeculativeMethod = "ngram"
    num_speculative_tokens: int = 4       # drafts verified per step, at most (vLLM's num_speculative_tokens)
    # prompt lookup: the longest suffix of min..max tokens that occurred earlier proposes what followed it
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    # draft_model: the draft's artifact under server.engines_root ("name" or "name@version"), same tokenizer;
    # eagle (trtllm): the EAGLE head's checkpoint directory the engine was built with
    draft_model: str | None = None
    # sim only: the chance that each draft is kept (the sim has no text to draft from; a real engine measures it)
    acceptance_rate: float | None = None


def speculative_errors(path: str, backend: str, table: SpeculativeConfig | None) -> list[str]:
    """Problems of one model's [speculative] table, each as `path.key: problem`."""
    if table is None:
        return []
    p = f"{path}.speculative"
    errors = []
    if backend not in ("reference", "torch", "sim", "trtllm"):
        errors.append(f"{p}: speculative decoding runs on the reference, torch, sim and trtllm backends (backend "
                      f"is {backend!r})")
    if backend == "trtllm" and table.method not in TRTLLM_METHODS:
        errors.append(f"{p}.method: TensorRT-LLM's TensorRT backend runs \"eagle\" (n-gram and draft-target "
                      f"speculation are its PyTorch backend's only), got {table.method!r}")
    if table.method == "eagle" and backend != "trtllm":
        errors.append(f"{p}.method: \"eagle\" runs on the trtllm backend (backend is {backend!r})")
    if table.method == "eagle" and table.draft_model is None:
        errors.append(f"{p}.draft_model: method \"eagle\" needs the EAGLE head's directory")
    rate = table.acceptance_rate
    if backend == "sim" and rate is None:
        errors.append(f"{p}.acceptance_rate: the sim needs one (the chance each draft is kept, in [0, 1))")
    elif rate is not None and backend != "sim":
        errors.append(f"{p}.acceptance_rate: only the sim takes one (a real engine measures its own)")
    elif rate is not None and not 0.0 <= rate < 1.0:
        errors.append(f"{p}.acceptance_rate: must be in [0, 1), got {rate}")
    if not 1 <= table.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
        errors.append(f"{p}.num_speculative_tokens: must be in [1, {MAX_SPECULATIVE_TOKENS}], "
                      f"got {table.num_speculative_tokens}")
    if not 1 <= table.prompt_lookup_min <= table.prompt_lookup_max:
        errors.append(f"{p}.prompt_lookup_min: need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                      f"{table.prompt_lookup_min} and {table.prompt_lookup_max}")
    if table.method == "draft_model" and table.draft_model is None:
        errors.append(f"{p}.draft_model: method \"draft_model\" needs the draft's artifact name")
    if table.method == "draft_model" and backend not in ("reference", "torch"):
        errors.append(f"{p}.method: \"draft_model\" runs on the reference and torch backends (backend is "
                      f"{backend!r})")
    if table.method == "ngram" and table.draft_model is not None:
        errors.append(f"{p}.draft_model: only methods \"draft_model\" and \"eagle\" take one (method is 'ngram')")
    return errors
