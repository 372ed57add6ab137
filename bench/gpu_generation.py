"""bench/gpu_check.py's generation phase: the torch engine's speculative decoding and int8 weights on the device.

- speculation: `small`'s shapes built to copy (inferd.artifacts.build.copying), batch 1, the repetitive and
  non-repetitive workloads of bench/speculative.py: decode tokens/s with prompt lookup (k = 4) and with a
  quarter-width draft model, against none, the engines alternating request by request;
- int8: the synthetic `small` model and its int8 version (build_engines.py --quantize int8): weight bytes on
  the device and decode tokens/s at batch 1 and 8, in the run's dtype.
Figures only; the goals are the CPU benches' (docs/speculative.md, docs/artifacts.md).
"""
from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from inferd.artifacts.build import build_synthetic
from inferd.artifacts.build.copying import build_copying
from inferd.engine.reference import quantize_artifact
from inferd.engine.speculative import Speculation
from inferd.engine.torch import TorchEngine
from inferd.types import GenerationRequest, SamplingParams


async def _rate(engine, tag: str, prompts: list[list[int]], max_tokens: int) -> float:
    """Decode tokens/s of `prompts` submitted together: tokens after each first over first-to-last time."""
    streams = [engine.submit(GenerationRequest(request_id=f"{tag}-{i}", tenant=f"t{i}", prompt_token_ids=tuple(p),
                                               sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                       ignore_eos=True)))
               for i, p in enumerate(prompts)]
    results = [await s.collect() for s in streams]
    first = min(r.timing.first_token for r in results)
    return sum(len(r.token_ids) - 1 for r in results) / (max(r.timing.finished for r in results) - first)


def _workloads(successor: np.ndarray, requests: int) -> dict[str, list[list[int]]]:
    rng = np.random.default_rng(0)
    vocab = successor.shape[0]
    out: dict[str, list[list[int]]] = {"repetitive": [], "non-repetitive": []}
    for _ in range(requests):
        span = [int(rng.integers(vocab))]
        for _ in range(299):
            span.append(int(successor[span[-1]]))
        out["repetitive"].append(span + rng.integers(vocab, size=20).tolist() + [span[5]])
        out["non-repetitive"].append(rng.integers(vocab, size=300).tolist())
    return out


async def _engines(kinds: dict, device: str, dtype: str) -> dict[str, TorchEngine]:
    engines = {}
    for name, (artifact, speculation) in kinds.items():
        engine = TorchEngine(artifact, device=device, dtype=dtype, num_kv_blocks=512, max_batch_size=8,
                             cuda_graphs=device != "cpu", speculative=speculation)
        await engine.start()
        await engine.warmup()
        engines[name] = engine
    return engines


async def speculation(args, work: Path, requests: int = 4, max_tokens: int = 128) -> dict:
    artifact, successor = build_copying("small", work / "engines")
    draft = build_copying("small", work / "engines", draft=True)[0]
    engines = await _engines({"off": (artifact, None), "ngram": (artifact, Speculation(num_tokens=4)),
                              "draft": (artifact, Speculation(method="draft_model", num_tokens=4,
                                                              draft_dir=str(draft)))}, args.device, args.dtype)
    report: dict = {}
    try:
        for workload, prompts in _workloads(successor, requests).items():
            rates: dict[str, list[float]] = {name: [] for name in engines}
            for i, prompt in enumerate(prompts):
                order = list(engines) if i % 2 == 0 else list(reversed(engines))
                for name in order:
                    rates[name].append(await _rate(engines[name], f"{workload}-{name}-{i}", [prompt], max_tokens))
            off = statistics.median(rates["off"])
            report[workload] = {"off_tokens_per_s": off,
                                **{f"{n}_speedup": statistics.median(rates[n]) / off for n in ("ngram", "draft")}}
        for name in ("ngram", "draft"):
            s = engines[name].stats().speculation
            report[f"{name}_acceptance"] = s.accepted_tokens / s.draft_tokens if s.draft_tokens else 0.0
    finally:
        for engine in engines.values():
            await engine.close()
    return report


async def int8(args, work: Path, max_tokens: int = 64) -> dict:
    base = build_synthetic("small", work / "engines", progress=lambda m: None)
    quantized = quantize_artifact(base, work / "engines")
    engines = await _engines({"float": (base, None), "int8": (quantized, None)}, args.device, args.dtype)
    try:
        rng = np.random.default_rng(1)
        report = {"weight_ratio": engines["int8"].model.weight_bytes() / engines["float"].model.weight_bytes()}
        for batch in (1, 8):
            prompts = [rng.integers(8192, size=64).tolist() for _ in range(batch)]
            rates = {name: [await _rate(e, f"{name}-{batch}-{r}", prompts, max_tokens) for r in range(3)]
                     for name, e in engines.items()}
            report[f"batch_{batch}"] = {name: statistics.median(v) for name, v in rates.items()}
    finally:
        for engine in engines.values():
            await engine.close()
    return report


async def generation(args, work: Path) -> dict:
    return {"speculation": await speculation(args, work), "int8": await int8(args, work)}


def generation_lines(r: dict) -> list[str]:
    s, q = r["speculation"], r["int8"]
    lines = []
    for workload in ("repetitive", "non-repetitive"):
        w = s[workload]
        lines.append(f"torch speculative speedup, {workload}: prompt lookup {w['ngram_speedup']:.2f}x, draft model "
                     f"{w['draft_speedup']:.2f}x (batch 1, {w['off_tokens_per_s']:,.0f} tokens/s without)")
    lines.append(f"torch speculative acceptance: prompt lookup {s['ngram_acceptance']:.3f}, draft model "
                 f"{s['draft_acceptance']:.3f}")
    lines.append(f"torch int8 weight bytes / float: {q['weight_ratio']:.3f}")
    for batch in (1, 8):
        b = q[f"batch_{batch}"]
        lines.append(f"torch int8 decode tokens/s at batch {batch}: {b['int8']:,.0f} against {b['float']:,.0f} "
                     f"(int8/float {b['int8'] / b['float']:.2f})")
    return lines
