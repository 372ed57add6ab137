"""Speculative decoding (prompt lookup) on the reference engine: batch-1 decode tokens/s with and without it.

The model: `small`'s shapes (~28M parameters, 8 layers) built to copy (inferd.artifacts.build.copying: its
greedy next token is a fixed successor of the current one), because a random model's output never repeats
and a real one cannot be downloaded here. Two workloads, greedy, `--max-tokens` each:
- repetitive: the prompt holds a 300-token span of the model's chain, then other text, then a token from the
  span's start: the output copies the span, as a model editing code copies what it does not change;
- non-repetitive: 300 random prompt tokens: the output shares no n-gram with the prompt, so the lookup
  finds nothing (or guesses wrong) and speculation can only cost.
`--method draft_model` drafts with a quarter-width, one-layer model of the same chain instead (it guesses
right on both workloads: what it shows is the draft model's cost against what its kept tokens save).
Decode tokens/s is the completion's tokens after the first over the time from the first to the last
(the prompt's prefill is the same with and without). Each configuration runs `--requests` requests one after
another, the two engines alternating request by request (the machine's speed drifts); the median rate counts.

    .venv/bin/python bench/speculative.py
    .venv/bin/python bench/speculative.py --method draft_model
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

import numpy as np

from inferd.artifacts.build.copying import build_copying
from inferd.engine.reference.engine import ReferenceEngine
from inferd.engine.speculative import Speculation
from inferd.types import GenerationRequest, SamplingParams


def workloads(successor: np.ndarray, requests: int, seed: int = 0) -> dict[str, list[list[int]]]:
    rng = np.random.default_rng(seed)
    vocab = successor.shape[0]
    repetitive, other = [], []
    for _ in range(requests):
        span = [int(rng.integers(vocab))]
        for _ in range(299):
            span.append(int(successor[span[-1]]))
        filler = rng.integers(vocab, size=20).tolist()
        repetitive.append(span + filler + [span[5]])
        other.append(rng.integers(vocab, size=300).tolist())
    return {"repetitive": repetitive, "non-repetitive": other}


async def decode_rate(engine: ReferenceEngine, rid: str, prompt: list[int], max_tokens: int) -> float:
    request = GenerationRequest(request_id=rid, prompt_token_ids=tuple(prompt), tenant="bench",
                                sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    result = await engine.submit(request).collect()
    timing = result.timing
    return (len(result.token_ids) - 1) / (timing.finished - timing.first_token)


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="inferd-bench-spec-") as tmp:
        artifact, successor = build_copying("small", Path(tmp))
        draft_dir = None
        if args.method == "draft_model":     # a quarter as wide, one layer: the same chain, flatter
            draft_dir = str(build_copying("small", Path(tmp), draft=True)[0])
        speculation = Speculation(method=args.method, num_tokens=args.k, min_n=args.min_n, max_n=args.max_n,
                                  draft_dir=draft_dir)
        engines = {"off": ReferenceEngine(artifact, num_kv_blocks=512, max_batch_size=4),
                   "on": ReferenceEngine(artifact, num_kv_blocks=512, max_batch_size=4, speculative=speculation)}
        for engine in engines.values():
            await engine.start()
            await engine.warmup()
        try:
            drafter = f"n-gram {args.min_n}..{args.max_n}" if args.method == "ngram" else "draft model small-copy-draft"
            print(f"model: small-copy ({artifact.name}), k={args.k}, {drafter}, "
                  f"{args.requests} requests x {args.max_tokens} tokens per configuration, batch 1")
            for name, prompts in workloads(successor, args.requests).items():
                rates: dict[str, list[float]] = {"off": [], "on": []}
                before = engines["on"].stats().speculation
                for i, prompt in enumerate(prompts):
                    for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                        rates[mode].append(await decode_rate(engines[mode], f"{name}-{mode}-{i}", prompt,
                                                             args.max_tokens))
                after = engines["on"].stats().speculation
                drafted = after.draft_tokens - before.draft_tokens
                kept = after.accepted_tokens - before.accepted_tokens
                verified = after.verifications - before.verifications
                off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
                print(f"decode tokens/s, {name}: {off:.1f} without, {on:.1f} with")
                print(f"acceptance rate, {name}: {kept / drafted if drafted else 0.0:.3f} "
                      f"({kept} of {drafted} draft tokens kept; "
                      f"{(kept + verified) / verified if verified else 0.0:.2f} tokens per verifying step)")
                print(f"speculative speedup, {name}: {on / off:.2f}x")
        finally:
            for engine in engines.values():
                await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step")
    parser.add_argument("--method", choices=("ngram", "draft_model"), default="ngram",
                        help="draft_model: a quarter-width one-layer copy of the model drafts")
    parser.add_argument("--min-n", type=int, default=2)
    parser.add_argument("--max-n", type=int, default=4)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
