#!/usr/bin/env python3
"""What does inferd cost on top of TensorRT-LLM? (GPU nodes only; see docs/gpu.md.)

The same workload (N greedy requests, fixed prompt token ids, C in flight) runs three ways, one after
the other on the same GPU (two LLMs would not fit together):

  direct   tensorrt_llm's own asyncio API: generate_async(..., streaming=True), trtllm-bench style
  engine   inferd's TrtllmEngine in process (no HTTP): the backend's own overhead
  daemon   `inferd serve` with backend = "trtllm", streamed over HTTP/SSE on 127.0.0.1

and reports output tokens/s of each and the ratios engine/direct and daemon/direct (target >= 0.97).

  python bench/trtllm_overhead.py --engine-dir engines/llama3-8b-trt/<version> [--requests 512]
      [--concurrency 64] [--input-len 512] [--output-len 256] [--modes direct,engine,daemon]

Every phase has a time limit (--phase-timeout-s) and the script stops itself.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 0.97


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine-dir", type=Path, required=True, help="a trtllm artifact / engine directory")
    p.add_argument("--tokenizer-dir", type=Path, default=None, help="default: the engine directory")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--max-batch-size", type=int, default=None, help="runtime cap (default: the engine's)")
    p.add_argument("--max-num-tokens", type=int, default=None, help="runtime cap (default: the engine's)")
    p.add_argument("--kv-fraction", type=float, default=0.85, help="kv_cache_free_gpu_memory_fraction")
    p.add_argument("--modes", default="direct,engine,daemon")
    p.add_argument("--port", type=int, default=18471)
    p.add_argument("--phase-timeout-s", type=float, default=900.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def require_tensorrt_llm() -> None:
    if importlib.util.find_spec("tensorrt_llm") is None:
        from inferd.engine.trtllm import INSTALL_HINT
        sys.exit(f"trtllm_overhead.py needs a GPU node with TensorRT-LLM. {INSTALL_HINT}")


def engine_limits(args: argparse.Namespace) -> None:
    """Same runtime caps in every mode: the daemon's config defaults (32 / 512) would handicap it."""
    build = json.loads((args.engine_dir / "config.json").read_text())["build_config"]
    args.max_batch_size = args.max_batch_size or build["max_batch_size"]
    args.max_num_tokens = args.max_num_tokens or build.get("max_num_tokens") or 8192


def make_prompts(args: argparse.Namespace) -> list[list[int]]:
    from inferd.engine import HFTokenizer

    tokenizer = HFTokenizer.from_dir(args.tokenizer_dir or args.engine_dir)
    special = set(tokenizer.eos_token_ids) | {tokenizer.bos_token_id}
    ordinary = [t for t in range(min(tokenizer.vocab_size, 32000)) if t not in special]
    rng = random.Random(args.seed)
    return [[rng.choice(ordinary) for _ in range(args.input_len)] for _ in range(args.requests)]


class Tally:
    def __init__(self) -> None:
        self.tokens = 0
        self.started = time.perf_counter()
        self.ttfts: list[float] = []

    def result(self, name: str) -> dict:
        elapsed = time.perf_counter() - self.started
        ttft = sorted(self.ttfts)
        return {"mode": name, "output_tokens": self.tokens, "seconds": round(elapsed, 3),
                "tokens_per_s": round(self.tokens / elapsed, 1) if elapsed else 0.0,
                "ttft_p50_s": round(ttft[len(ttft) // 2], 4) if ttft else None}


async def run_workload(prompts: list[list[int]], concurrency: int, one) -> Tally:
    tally, gate = Tally(), asyncio.Semaphore(concurrency)

    async def guarded(i: int, ids: list[int]) -> None:
        async with gate:
            t0 = time.perf_counter()
            tokens, first = await one(i, ids)
            tally.tokens += tokens
            if first is not None:
                tally.ttfts.append(first - t0)

    await asyncio.gather(*(guarded(i, ids) for i, ids in enumerate(prompts)))
    return tally


async def bench_direct(args, prompts) -> dict:
    from tensorrt_llm import SamplingParams
    from tensorrt_llm._tensorrt_engine import LLM
    from tensorrt_llm.llmapi import KvCacheConfig

    llm = await asyncio.to_thread(LLM, model=str(args.engine_dir), tokenizer=str(args.tokenizer_dir or args.engine_dir),
                                  kv_cache_config=KvCacheConfig(free_gpu_memory_fraction=args.kv_fraction),
                                  enable_chunked_prefill=True, max_batch_size=args.max_batch_size,
                                  max_num_tokens=args.max_num_tokens)
    try:
        async def one(i: int, ids: list[int]):
            out = llm.generate_async(ids, sampling_params=SamplingParams(max_tokens=args.output_len, top_k=1,
                                                                         detokenize=False), streaming=True)
            first = None
            async for step in out:
                if first is None and step.outputs[0].token_ids:
                    first = time.perf_counter()
            return len(out.outputs[0].token_ids), first

        await run_workload(prompts[:8], 8, one)                       # warm-up, not measured
        tally = await asyncio.wait_for(run_workload(prompts, args.concurrency, one), args.phase_timeout_s)
        return tally.result("direct")
    finally:
        await asyncio.to_thread(llm.shutdown)


async def bench_engine(args, prompts) -> dict:
    from inferd.engine.trtllm import TrtllmEngine
    from inferd.types import GenerationRequest, SamplingParams

    engine = TrtllmEngine(args.engine_dir, tokenizer_dir=args.tokenizer_dir, max_batch_size=args.max_batch_size,
                          max_num_tokens=args.max_num_tokens, kv_cache_free_gpu_memory_fraction=args.kv_fraction, enable_chunked_prefill=True)
    await engine.start()
    try:
        await engine.warmup()
        sampling = SamplingParams(max_tokens=args.output_len, temperature=0.0)

        async def one(i: int, ids: list[int]):
            stream = engine.submit(GenerationRequest(request_id=f"bench-{i}-{time.monotonic_ns()}",
                                                     prompt_token_ids=tuple(ids), sampling=sampling))
            first, tokens = None, 0
            async for delta in stream:
                if first is None and delta.token_ids:
                    first = time.perf_counter()
                tokens += len(delta.token_ids)
            return tokens, first

        await run_workload(prompts[:8], 8, one)
        tally = await asyncio.wait_for(run_workload(prompts, args.concurrency, one), args.phase_timeout_s)
        return tally.result("engine")
    finally:
        await engine.close()


def daemon_config(args: argparse.Namespace) -> str:
    trt = {"engine_dir": str(args.engine_dir.resolve()), "kv_cache_free_gpu_memory_fraction": args.kv_fraction,
           "enable_chunked_prefill": True}
    if args.tokenizer_dir:
        trt["tokenizer_dir"] = str(args.tokenizer_dir.resolve())
    lines = ["[server]", 'host = "127.0.0.1"', f"port = {args.port}", "", "[models.bench]", 'backend = "trtllm"',
             f"max_batch_size = {args.max_batch_size}", f"max_num_tokens = {args.max_num_tokens}"]
    lines += ["", "[models.bench.trtllm]"] + [f"{k} = {json.dumps(v)}" for k, v in trt.items()]
    return "\n".join(lines) + "\n"


async def bench_daemon(args, prompts) -> dict:
    import aiohttp

    base = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory(prefix="inferd-bench-") as tmp:
        config = Path(tmp) / "config.toml"
        config.write_text(daemon_config(args))
        # The daemon is its own process, with the `if __name__ == "__main__"` guard TensorRT-LLM's MPI worker needs.
        proc = subprocess.Popen([sys.executable, "-m", "inferd", "serve", "--config", str(config)], cwd=tmp)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
                deadline = time.monotonic() + args.phase_timeout_s
                while True:                                            # engine load + warmup take minutes
                    if proc.poll() is not None:
                        raise SystemExit(f"inferd serve exited with {proc.returncode} before it was ready")
                    if time.monotonic() > deadline:
                        raise SystemExit("inferd serve was not ready within --phase-timeout-s")
                    try:
                        async with session.get(f"{base}/readyz") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(1.0)

                async def one(i: int, ids: list[int]):
                    body = {"model": "bench", "prompt": ids, "max_tokens": args.output_len, "temperature": 0,
                            "stream": True, "stream_options": {"include_usage": True}}
                    first, tokens = None, 0
                    async with session.post(f"{base}/v1/completions", json=body) as r:
                        r.raise_for_status()
                        async for raw in r.content:
                            line = raw.decode().strip()
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            chunk = json.loads(line[6:])
                            if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                                first = time.perf_counter()
                            if chunk.get("usage"):
                                tokens = chunk["usage"]["completion_tokens"]
                    return tokens, first

                await run_workload(prompts[:8], 8, one)
                tally = await asyncio.wait_for(run_workload(prompts, args.concurrency, one), args.phase_timeout_s)
                return tally.result("daemon")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()


async def main_async(args: argparse.Namespace) -> int:
    engine_limits(args)
    prompts = make_prompts(args)
    runners = {"direct": bench_direct, "engine": bench_engine, "daemon": bench_daemon}
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in runners]
    if unknown:
        sys.exit(f"unknown mode(s) {unknown}; choose from {sorted(runners)}")
    results = {}
    for mode in modes:
        print(f"-- {mode}: {args.requests} requests, {args.concurrency} in flight, "
              f"{args.input_len} in / {args.output_len} out", file=sys.stderr)
        results[mode] = await runners[mode](args, prompts)
        print(json.dumps(results[mode]))
    direct = results.get("direct", {}).get("tokens_per_s")
    ok = True
    for mode in ("engine", "daemon"):
        if direct and mode in results:
            ratio = results[mode]["tokens_per_s"] / direct
            ok = ok and ratio >= TARGET_RATIO
            print(json.dumps({"ratio": f"{mode}/direct", "value": round(ratio, 4), "target": TARGET_RATIO}))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_tensorrt_llm()
    os.environ.setdefault("TLLM_LOG_LEVEL", "WARNING")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
