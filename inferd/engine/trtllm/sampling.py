"""The penalties, min_p and logit_bias on TensorRT-LLM: what maps onto its SamplingParams with vLLM's meaning,
and a 400 naming the parameter for what does not (never a silent difference). The facts, with the files
they come from, are in docs/trtllm-api.md §3a:

- `logit_bias` -> `embedding_bias`, a float32 torch tensor of the engine's vocabulary size
  (sampling_params.py; serve/openai_protocol.py builds it the same way). The penalty kernel adds it
  before temperature and the penalties, as vLLM adds logit_bias first.
- `repetition_penalty` -> `repetition_penalty`: the kernel divides a positive logit and multiplies a
  negative one of every prompt and output token, as vLLM does. It does so after temperature, which
  scales every logit by one positive factor and so changes neither their signs nor the result.
- `presence_penalty`, `frequency_penalty`: the kernel (cpp/tensorrt_llm/kernels/penaltyKernels.cu) counts
  the prompt's tokens too and subtracts them after temperature; vLLM counts the output only, before
  temperature. SamplingParams @a98a9061 has no way to leave the prompt out, so a non-zero value is refused.
- `min_p` -> `min_p` where temperature is 1 (or the request is greedy, where vLLM's min_p changes
  nothing): TensorRT-LLM's min-p kernel takes its cutoff from the probabilities before temperature, vLLM
  after it, and the two agree only at temperature 1. Elsewhere it is refused.
"""
from __future__ import annotations

from typing import Any

from inferd.engine.base import InvalidRequest
from inferd.types import SamplingParams


def refuse_unsupported(sp: SamplingParams) -> None:
    """InvalidRequest naming the first parameter TensorRT-LLM cannot apply with vLLM's meaning."""
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(sp, name):
            raise InvalidRequest(f"{name} is not supported on the trtllm backend: TensorRT-LLM counts prompt "
                                 f"tokens in it too (only 0 is accepted here)", name)
    if sp.min_p and not sp.greedy and sp.temperature != 1.0:
        raise InvalidRequest("min_p is supported on the trtllm backend only with temperature 1 (TensorRT-LLM "
                             "takes its cutoff before temperature)", "min_p")


def penalty_kwargs(sp: SamplingParams, embedding_vocab: int) -> dict[str, Any]:
    """The SamplingParams keyword arguments for `sp`'s penalties, min_p and logit_bias (none when unset)."""
    kw: dict[str, Any] = {}
    if sp.repetition_penalty != 1.0:
        kw["repetition_penalty"] = sp.repetition_penalty
    if sp.min_p and not sp.greedy:
        kw["min_p"] = sp.min_p
    if sp.logit_bias:
        kw["embedding_bias"] = embedding_bias(sp.logit_bias, embedding_vocab)
    return kw


def embedding_bias(bias: tuple[tuple[int, float], ...], vocab: int) -> Any:
    """logit_bias as the [vocab] float32 tensor TensorRT-LLM adds to the logits."""
    import torch     # TensorRT-LLM's own dependency: only requests with a logit_bias need it

    tensor = torch.zeros(vocab, dtype=torch.float32)
    tensor[torch.tensor([t for t, _ in bias], dtype=torch.long)] = torch.tensor([b for _, b in bias],
                                                                                dtype=torch.float32)
    return tensor
