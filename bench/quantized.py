"""Int8 weight-only against float32 on the reference engine, in one run: memory, decode speed, agreement.

Builds the synthetic `small` model (~28M parameters, 8 layers) and its int8 version
(inferd.engine.reference.quantize) in a temp dir, then prints:
- the weights' bytes, int8 over float32 (the goal: <= 0.3);
- decode tokens/s of each at batch 1 and batch 8 (the tokens after the first over the time from the first to
  the last; `--requests` rounds, the two engines alternating round by round, the median counting); the
  first batch size's also as the named lines `decode tokens/s float32: X` and `decode tokens/s int8: X`;
- top-1 agreement (int8's argmax equal to float32's) at every position of a fixed set of prompts, and
  perplexity on them, int8 over float32 (the goal: within 2%).
A random model's predictions are flatter than a trained one's, so agreement here is a harder test than on
a real checkpoint, where the argmax usually has a wide margin.
OpenBLAS runs one thread unless OPENBLAS_NUM_THREADS says otherwise: on a busy machine its spinning workers
slowed float32's large products tenfold (12 tokens/s at batch 1 against 123 with one thread, in the same
minute) and int8's small blocked ones hardly at all, so the ratio measured the machine's load, not int8.

    .venv/bin/python bench/quantized.py
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from pathlib import Path

# Before NumPy loads (see above).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from inferd.artifacts.build import build_synthetic  # noqa: E402
from inferd.engine.reference import quantize_artifact  # noqa: E402
from inferd.engine.reference.engine import ReferenceEngine  # noqa: E402
from inferd.engine.reference.scoring import compare  # noqa: E402
from inferd.types import GenerationRequest, SamplingParams  # noqa: E402


async def decode_rate(engine: ReferenceEngine, tag: str, batch: int, max_tokens: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    streams = [engine.submit(GenerationRequest(
        request_id=f"{tag}-{i}", tenant=f"t{i}", prompt_token_ids=tuple(rng.integers(8192, size=64).tolist()),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))) for i in range(batch)]
    results = [await s.collect() for s in streams]
    first = min(r.timing.first_token for r in results)
    last = max(r.timing.finished for r in results)
    return sum(len(r.token_ids) - 1 for r in results) / (last - first)


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="inferd-bench-int8-") as tmp:
        root = Path(tmp)
        base = build_synthetic("small", root, progress=lambda m: None)
        int8 = quantize_artifact(base, root)
        engines = {"float32": ReferenceEngine(base, num_kv_blocks=512),
                   "int8": ReferenceEngine(int8, num_kv_blocks=512)}
        for engine in engines.values():
            await engine.start()
            await engine.warmup()
        try:
            f32, i8 = (engines[k].model for k in ("float32", "int8"))
            print(f"model: small ({base.name}) and its int8 version ({int8.name}); "
                  f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}")
            print(f"weight memory int8/float32: {i8.weight_bytes() / f32.weight_bytes():.3f} "
                  f"({i8.weight_bytes() / 2**20:.1f} MiB against {f32.weight_bytes() / 2**20:.1f} MiB)")
            for batch in args.batches:
                rates: dict[str, list[float]] = {"float32": [], "int8": []}
                for r in range(args.requests):
                    for name in (("float32", "int8") if r % 2 == 0 else ("int8", "float32")):
                        rates[name].append(await decode_rate(engines[name], f"{name}-{batch}-{r}", batch,
                                                             args.max_tokens, r))
                f, q = statistics.median(rates["float32"]), statistics.median(rates["int8"])
                if batch == args.batches[0]:            # the headline figures, one named line each
                    print(f"decode tokens/s float32: {f:.1f} (batch {batch})")
                    print(f"decode tokens/s int8: {q:.1f} (batch {batch})")
                print(f"decode tokens/s at batch {batch}: float32 {f:.1f}, int8 {q:.1f} (int8/float32 {q / f:.2f})")
            tokenizer = engines["float32"].tokenizer
            rng = np.random.default_rng(0)
            words = "the of and to in is was that for on with as by at from his her they we you this".split()
            prompts = [tokenizer.encode(" ".join(rng.choice(words, size=48))) for _ in range(args.prompts)]
            agreement, clear, perplexity = compare(f32, i8, prompts)
            print(f"top-1 agreement: {agreement:.4f} ({sum(len(p) - 1 for p in prompts)} positions, "
                  f"{args.prompts} prompts)")
            print(f"top-1 agreement where float32's argmax leads by > 0.1 nats: {clear:.4f}")
            print(f"perplexity int8/float32: {perplexity:.4f}")
        finally:
            for engine in engines.values():
                await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5, help="rounds per batch size")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompts", type=int, default=16)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
