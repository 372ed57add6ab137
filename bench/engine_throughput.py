"""Aggregate decode throughput of the ReferenceEngine at 1, 8 and 32 concurrent sequences.

    .venv/bin/python bench/engine_throughput.py [--model small] [--engines-root engines]

Builds the synthetic model if missing, then for each concurrency submits that many requests at
once (distinct prompts and tenants, so nothing comes from the prefix cache; greedy, ignore_eos)
and measures decode tokens/s: tokens after each request's first one, over the window from the
last first token to the last finish. The per-step token budget admits every prompt in one step,
so that window is pure decode. Prints each figure and the 32:1 ratio. Bounded: a fixed amount
of work, best of --repeats runs, and a timeout per run.

On a contended machine, OpenBLAS's own worker threads spin against other processes and make
the single-sequence (GEMV-sized) steps erratic; `OPENBLAS_NUM_THREADS=1` gives steadier figures.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import numpy as np

from inferd.artifacts.build import build_synthetic
from inferd.engine.reference import ReferenceEngine
from inferd.types import GenerationRequest, SamplingParams

CONCURRENCY = (1, 8, 32)


async def run_once(engine: ReferenceEngine, num_seqs: int, prompt_len: int, max_tokens: int, tag: str) -> float:
    rng = np.random.default_rng(num_seqs)
    vocab = engine.model.config.vocab_size
    streams = [engine.submit(GenerationRequest(
        request_id=f"{tag}-{i}", tenant=f"{tag}-{i}",
        prompt_token_ids=tuple(int(t) for t in rng.integers(1, vocab, size=prompt_len)),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)))
        for i in range(num_seqs)]
    finals = await asyncio.gather(*(s.collect() for s in streams))
    tokens = sum(f.usage.completion_tokens - 1 for f in finals)
    window = max(f.timing.finished for f in finals) - max(f.timing.first_token for f in finals)
    return tokens / window


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small", choices=("tiny", "small"))
    parser.add_argument("--engines-root", type=Path, default=Path("engines"))
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run before giving up")
    args = parser.parse_args()

    artifact = build_synthetic(args.model, args.engines_root, progress=lambda message: None)
    top = max(CONCURRENCY)
    blocks_per_seq = -(-(args.prompt_len + args.max_tokens) // 16)
    engine = ReferenceEngine(artifact, num_kv_blocks=top * blocks_per_seq + 16, block_size=16,
                             max_batch_size=top, max_num_tokens=top * args.prompt_len)
    await engine.start()
    try:
        await engine.warmup()
        print(f"model {engine.info.model_name}@{engine.info.version}, prompt {args.prompt_len} tokens, "
              f"{args.max_tokens} new tokens per sequence, best of {args.repeats}, "
              f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, {os.cpu_count()} CPUs")
        results: dict[int, float] = {}
        for n in CONCURRENCY:
            runs = []
            for r in range(args.repeats):
                started = time.monotonic()
                runs.append(await asyncio.wait_for(
                    run_once(engine, n, args.prompt_len, args.max_tokens, f"c{n}r{r}"), args.timeout))
                elapsed = time.monotonic() - started
            results[n] = max(runs)
            print(f"  {n:3d} concurrent: {results[n]:8.1f} decode tokens/s aggregate "
                  f"({results[n] / n:6.1f} per sequence; last run {elapsed:.1f}s wall)")
        stats = engine.stats()
        print(f"  ratio {top}:1 = {results[top] / results[1]:.2f}x   "
              f"(step latency EMA {stats.step_latency_s * 1e3:.1f} ms, {stats.steps_total} steps)")
    finally:
        await engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
