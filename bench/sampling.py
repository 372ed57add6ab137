"""What n and logprobs cost on the reference engine, as ratios from one run.

    .venv/bin/python bench/sampling.py [--model small] [--prompt-len 384] [--max-tokens 16] [--repeats 3]

- `n=4 vs 4 requests`: the four engine requests `n=4` becomes (one prompt, one tenant, seeds s..s+3,
  submitted together: the later three fork after the first's prefill and share its KV blocks) against
  four requests of the same prompt from four tenants (prefix caches are per tenant, so nothing is
  shared: four prefills). Tokens/s of the first over the second; the goal is at least 1.3x.
- `logprobs=5 cost`: the same batch of requests with `logprobs=5` (each token's raw log-probability and
  its 5 most likely alternatives) against none: wall time with over wall time without; the goal is at
  most 1.1x.
Each figure is the best of --repeats runs, taken alternately so a slow moment of the machine hits both
sides. Prints `n=4 vs 4 requests: Xx` and `logprobs=5 cost: Xx` on lines of their own.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

# Before NumPy loads: OpenBLAS's spinning worker threads make small steps erratic on a busy machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from inferd.artifacts.build import build_synthetic  # noqa: E402
from inferd.engine.reference import ReferenceEngine  # noqa: E402
from inferd.types import GenerationRequest, SamplingParams  # noqa: E402


def requests(prompt: tuple[int, ...], tenants: list[str], tag: str, max_tokens: int,
             logprobs: int | None = None) -> list[GenerationRequest]:
    return [GenerationRequest(request_id=f"{tag}-{i}", tenant=tenant, prompt_token_ids=prompt,
                              sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=7 + i,
                                                      ignore_eos=True, logprobs=logprobs))
            for i, tenant in enumerate(tenants)]


async def timed(engine: ReferenceEngine, gens: list[GenerationRequest]) -> tuple[float, int]:
    """Wall seconds from submitting `gens` together to the last one finishing, and their output tokens."""
    t0 = time.monotonic()
    finals = await asyncio.gather(*(engine.submit(g).collect() for g in gens))
    return time.monotonic() - t0, sum(f.usage.completion_tokens for f in finals)


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small", choices=("tiny", "small"))
    p.add_argument("--engines-root", type=Path, default=Path("engines"))
    p.add_argument("--prompt-len", type=int, default=384)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    artifact = build_synthetic(args.model, args.engines_root, progress=lambda message: None)
    engine = ReferenceEngine(artifact, num_kv_blocks=512, block_size=16, max_batch_size=32, max_num_tokens=2048)
    await engine.start()
    try:
        vocab = engine.model.config.vocab_size
        rng = np.random.default_rng(0)
        forked, separate, plain, with_logprobs = [], [], [], []
        for r in range(args.repeats):
            # a fresh prompt each repeat, so no run is served by an earlier run's prefix cache
            prompt = tuple(int(t) for t in rng.integers(1, vocab, size=args.prompt_len))
            wall, tokens = await timed(engine, requests(prompt, ["t"] * 4, f"n-{r}", args.max_tokens))
            forked.append(tokens / wall)
            prompt = tuple(int(t) for t in rng.integers(1, vocab, size=args.prompt_len))
            tenants = [f"t{r}-{i}" for i in range(4)]
            wall, tokens = await timed(engine, requests(prompt, tenants, f"sep-{r}", args.max_tokens))
            separate.append(tokens / wall)
            batch = [f"p{r}-{i}" for i in range(8)]
            prompt = tuple(int(t) for t in rng.integers(1, vocab, size=64))
            plain.append((await timed(engine, requests(prompt, batch, f"plain-{r}", 4 * args.max_tokens)))[0])
            prompt = tuple(int(t) for t in rng.integers(1, vocab, size=64))
            with_logprobs.append((await timed(engine, requests(prompt, [b + "x" for b in batch], f"lp-{r}",
                                                               4 * args.max_tokens, logprobs=5)))[0])
    finally:
        await engine.close()
    print(f"n=4 (one prompt, forked): {max(forked):,.1f} tokens/s; 4 separate requests: {max(separate):,.1f} tokens/s")
    print(f"n=4 vs 4 requests: {max(forked) / max(separate):.2f}x")
    print(f"8 requests x {4 * args.max_tokens} tokens: {min(plain) * 1000:.0f} ms without logprobs, "
          f"{min(with_logprobs) * 1000:.0f} ms with logprobs=5")
    print(f"logprobs=5 cost: {min(with_logprobs) / min(plain):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
