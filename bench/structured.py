"""What a JSON-schema request costs per generated token on the reference engine, against a free one.

    .venv/bin/python bench/structured.py [--model small] [--max-tokens 64] [--repeats 5]

One request at a time (the worst case for the grammar's share: nothing else in the step), the same
16-token prompt, greedy, `--max-tokens` tokens each: the schema is an object with one free string, which a
random model fills until max_tokens, so both sides generate the same number of tokens. CPU seconds
(time.process_time: every thread of the process, the engine's step thread included) per generated token,
runs taken alternately so a slow moment of the machine hits both sides; the median of each side.
The schema is compiled before the first run (as the API's grammar stage does, off the loop), and once more
for the second request, which must compile nothing.
Prints `json_schema per-token cost: Xx` (goal: at most 1.15x) and `second request compiles: N`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

# Before NumPy loads: OpenBLAS's spinning worker threads make small steps erratic on a busy machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from inferd.artifacts.build import build_synthetic  # noqa: E402
from inferd.engine.reference import ReferenceEngine  # noqa: E402
from inferd.types import GenerationRequest, GuidedDecoding, SamplingParams  # noqa: E402

SCHEMA = {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"],
          "additionalProperties": False}
GUIDED = GuidedDecoding(kind="json_schema", spec=json.dumps(SCHEMA, separators=(",", ":"), sort_keys=True))


async def cpu_per_token(engine: ReferenceEngine, rid: str, prompt: tuple[int, ...], max_tokens: int,
                        guided: GuidedDecoding | None) -> float:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, guided=guided)
    t0 = time.process_time()
    final = await engine.submit(GenerationRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling)).collect()
    return (time.process_time() - t0) / final.usage.completion_tokens


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small", choices=("tiny", "small"))
    p.add_argument("--engines-root", type=Path, default=Path("engines"))
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    artifact = build_synthetic(args.model, args.engines_root, progress=lambda message: None)
    engine = ReferenceEngine(artifact, num_kv_blocks=256, block_size=16, max_batch_size=8, max_num_tokens=512)
    await engine.start()
    try:
        await engine.warmup()
        grammars = engine.grammars
        await asyncio.to_thread(grammars.compile, GUIDED)          # the API's grammar stage
        prompt = tuple(engine.tokenizer.encode("Summarize the following text in one sentence, please: the"))[:16]
        await cpu_per_token(engine, "warm-json", prompt, 8, GUIDED)   # first matcher, first mask
        free, guided = [], []
        for r in range(args.repeats):
            free.append(await cpu_per_token(engine, f"free-{r}", prompt, args.max_tokens, None))
            before = grammars.compiles
            await asyncio.to_thread(grammars.compile, GUIDED)      # the second request's grammar stage
            second = grammars.compiles - before
            guided.append(await cpu_per_token(engine, f"json-{r}", prompt, args.max_tokens, GUIDED))
    finally:
        await engine.close()
    f, g = statistics.median(free), statistics.median(guided)
    print(f"{args.model}, {args.max_tokens} tokens, median of {args.repeats}: {f * 1e3:.3f} ms CPU/token free, "
          f"{g * 1e3:.3f} ms CPU/token with a json_schema")
    print(f"json_schema per-token cost: {g / f:.2f}x")
    print(f"second request compiles: {second}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
