"""`[models.<name>] task` and `[models.<name>.batching]`: embedding models and their dynamic batcher.

A model's task is `generate` (completions and chat) or `embed` (/v1/embeddings). A reference model's
artifact says which it is (an `[embedding]` table in its manifest), so `task` may be left out; a sim
model is `generate` unless it says `task = "embed"`. TensorRT-LLM serves generation only here: the
LLM API inferd drives (docs/trtllm-api.md) returns tokens and logits, not pooled hidden states.

The batcher closes a batch at the size caps (the model's max_batch_size requests, max_num_tokens
tokens), when its oldest request has waited Wmax, or when waiting longer would make a member miss its
deadline. Wmax = latency target - measured compute time of the batch - margin, within
[min_wait_ms, max_wait_ms]. The latency target is `latency_target_ms`, else the tightest `[slos.*]`
with `sli = "latency"` on the model, else DEFAULT_LATENCY_TARGET_MS. `policy` = "window" (a fixed
`window_ms`) or "none" (one request per batch) are the baselines bench/unary_batching.py compares.
"""
from __future__ import annotations

import math
from typing import Literal

import msgspec

from inferd.config.walk import ConfigTable

Task = Literal["generate", "embed"]
BatchPolicy = Literal["deadline", "window", "none"]
DEFAULT_LATENCY_TARGET_MS = 50.0


class BatchingConfig(ConfigTable):
    policy: BatchPolicy = "deadline"
    latency_target_ms: float | None = None     # default: the model's latency SLO, else 50 ms
    margin_ms: float = 2.0                     # kept free of the target: timer and hand-off jitter
    min_wait_ms: float = 0.0                   # Wmax floor
    max_wait_ms: float | None = None           # Wmax ceiling (None: only the target bounds it)
    window_ms: float = 10.0                    # policy = "window" only


def embedding_errors(path: str, backend: str, task: Task | None, batching: BatchingConfig | None,
                     lora_adapters: dict[str, str]) -> list[str]:
    """Problems of one model's task and batching settings, each as `path.key: problem`."""
    errors = []
    if task == "embed" and backend == "trtllm":
        errors.append(f"{path}.task: backend 'trtllm' serves generation only (TensorRT-LLM's LLM API has no "
                      f"pooled-embedding output); serve embedding models with backend 'reference' or 'sim'")
    if task == "embed" and backend == "torch":
        errors.append(f"{path}.task: backend 'torch' serves generation only; serve embedding models with "
                      f"backend 'reference' or 'sim'")
    if task == "embed" and lora_adapters:
        errors.append(f"{path}.lora_adapters: LoRA adapters are for generation models, not task = 'embed'")
    if batching is None:
        return errors
    if task == "generate" or (task is None and backend != "reference"):
        errors.append(f"{path}.batching: the dynamic batcher is for embedding models (set task = \"embed\")")
    b = f"{path}.batching"
    for key in ("latency_target_ms", "margin_ms", "min_wait_ms", "max_wait_ms", "window_ms"):
        value = getattr(batching, key)
        positive = key in ("latency_target_ms", "window_ms")
        if value is not None and not ((value > 0 if positive else value >= 0) and math.isfinite(value)):
            errors.append(f"{b}.{key}: must be a {'positive' if positive else 'non-negative'} number of "
                          f"milliseconds, got {value}")
    if batching.max_wait_ms is not None and batching.max_wait_ms < batching.min_wait_ms:
        errors.append(f"{b}.max_wait_ms: must be >= min_wait_ms ({batching.min_wait_ms}), got {batching.max_wait_ms}")
    return errors


def latency_targets(cfg) -> dict[str, float]:
    """Served model -> the tightest `sli = "latency"` SLO threshold (ms) on it or an alias of it."""
    targets: dict[str, float] = {}
    for slo in cfg.slos.values():
        if slo.sli != "latency" or slo.threshold_ms is None:
            continue
        alias = cfg.aliases.get(slo.model)
        models = [slo.model] if alias is None else [t.partition("@")[0] for t in alias.split]
        for m in models:
            targets[m] = min(targets.get(m, math.inf), slo.threshold_ms)
    return targets


def with_batching_targets(cfg):
    """The config with batching.latency_target_ms filled in from the latency SLOs, for every model
    that has a batching table, says task = "embed", or is named by a latency SLO, so the engine factory
    needs nothing but the model's table (a reference model's task is known only from its artifact;
    one without either falls back to the default there)."""
    targets = latency_targets(cfg)
    models = {}
    for name, m in cfg.models.items():
        wanted = m.batching is not None or m.task == "embed" or name in targets
        if not wanted or (m.batching is not None and m.batching.latency_target_ms is not None):
            models[name] = m
            continue
        batching = m.batching or BatchingConfig()
        target = targets.get(name, DEFAULT_LATENCY_TARGET_MS)
        models[name] = msgspec.structs.replace(m, batching=msgspec.structs.replace(batching, latency_target_ms=target))
    return msgspec.structs.replace(cfg, models=models)
