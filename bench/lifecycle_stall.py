"""Does loading a model stall the models already serving? (the target: p99 TTFT of a hot model while
another loads stays <= 1.2x its p99 alone)

    .venv/bin/python bench/lifecycle_stall.py [--engine reference|sim] [--seconds 10] [--concurrency 2]

The real daemon (a subprocess pinned to CPU 0; this script, the client, on CPU 1) under a memory budget
that holds both of its models: `hot`, pinned, and `other`, cold. Phases, each --seconds long:
  1. `alone`: --concurrency clients stream completions from `hot` one after another (16 tokens, greedy);
     each request's TTFT (send to first token) is recorded.
  2. `loading`: the same, while an admin client loads `other` (POST /admin/models/other/load) and unloads
     it again, over and over: a load is always under way or about to be.
It prints TTFT p50/p99 per phase, the p99 ratio (the goal: <= 1.2), how many loads ran and how long
they took. `--engine reference` (default): both are the synthetic `small` (a real load: verify the
artifact's sha256s, read and convert the weights, allocate the KV pool, warm up, in threads beside the
NumPy decode of `hot` on the same CPU); `--engine sim`: Llama-3-8B on an H100 (simulated: a load is the
profile's 8.5 s of weights at 2 GB/s, time that costs the CPU nothing, as a GPU's DMA would not).
Loopback only; bounded by --seconds; stops the daemon itself.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
from pathlib import Path

from daemon_process import daemon_or_bench, spawn  # noqa: E402 (bench/ is this script's own directory)

SERVER_CPU, CLIENT_CPU = 0, 1
CONFIG = """
[server]
host = "127.0.0.1"
port = 0
engines_root = "{engines}"
log_level = "warning"
model_memory_bytes = {budget}
min_residency_s = 0

[audit]
path = "audit.jsonl"
{models}
"""
REFERENCE = """
[models.{name}]
backend = "reference"
artifact = "small"
max_batch_size = 8
max_num_tokens = 512
num_kv_blocks = 512
pinned = {pinned}
"""
SIM = """
[models.{name}]
backend = "sim"
max_batch_size = 8
max_num_tokens = 512
num_kv_blocks = 1024
memory_bytes = 30_000_000_000
pinned = {pinned}
[models.{name}.sim]
profile = "llama3-8b-h100"
simulate_load = true
max_model_len = 2048
"""


def start_daemon(workdir: Path, engine: str) -> tuple[subprocess.Popen, dict]:
    engines = workdir / "engines"
    template = SIM
    if engine == "reference":
        from inferd.artifacts.build.reference import build_synthetic

        build_synthetic("small", engines, progress=lambda message: None)
        template = REFERENCE
    models = "".join(template.format(name=n, pinned=str(n == "hot").lower()) for n in ("hot", "other"))
    config = workdir / "inferd.toml"
    config.write_text(CONFIG.format(engines=engines, budget=10 ** 12, models=models))
    return spawn([__file__, "--role", "daemon", "--config", str(config)], workdir, "daemon.log", SERVER_CPU)


async def client(http, url: str, until: float, ttfts: list[float]) -> None:
    body = {"model": "hot", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0,
            "stream": True}
    while time.monotonic() < until:
        t0 = time.perf_counter()
        first = None
        async with http.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"hot got {resp.status}: {await resp.text()}")
            async for line in resp.content:
                if first is None and line.startswith(b"data: {"):
                    first = time.perf_counter() - t0
        ttfts.append(first)


async def churn(http, url: str, stop: asyncio.Event, loads: list[float]) -> None:
    """Load `other`, unload it, again, until `stop`: a load is always under way or about to be."""
    while not stop.is_set():
        t0 = time.perf_counter()
        async with http.post(url + "/admin/models/other/load") as resp:
            if resp.status != 200:
                raise RuntimeError(f"load got {resp.status}: {await resp.text()}")
        loads.append(time.perf_counter() - t0)
        async with http.post(url + "/admin/models/other/unload") as resp:
            if resp.status != 200:
                raise RuntimeError(f"unload got {resp.status}: {await resp.text()}")


def summary(ttfts: list[float]) -> dict:
    ordered = sorted(ttfts)
    return {"requests": len(ordered), "ttft_p50_ms": 1000 * statistics.median(ordered),
            "ttft_p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


async def run_bench(args: argparse.Namespace, port: int) -> dict:
    import aiohttp

    url = f"http://127.0.0.1:{port}"
    out: dict = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        await client(http, url, time.monotonic() + 1.0, [])          # warm-up
        for phase in ("alone", "loading"):
            ttfts: list[float] = []
            loads: list[float] = []
            stop = asyncio.Event()
            churner = asyncio.ensure_future(churn(http, url, stop, loads)) if phase == "loading" else None
            until = time.monotonic() + args.seconds
            await asyncio.gather(*(client(http, url, until, ttfts) for _ in range(args.concurrency)))
            if churner is not None:
                stop.set()
                await asyncio.wait_for(churner, 300)
            out[phase] = summary(ttfts)
            if loads:
                out[phase].update(loads=len(loads), load_s_mean=statistics.fmean(loads))
    out["p99_ratio"] = out["loading"]["ttft_p99_ms"] / out["alone"]["ttft_p99_ms"]
    out["p50_ratio"] = out["loading"]["ttft_p50_ms"] / out["alone"]["ttft_p50_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", default="bench", choices=("bench", "daemon"))
    parser.add_argument("--config", type=Path)
    parser.add_argument("--engine", default="reference", choices=("reference", "sim"))
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument("--concurrency", type=int, default=2, help="clients streaming from the hot model")
    args = parser.parse_args()
    results = daemon_or_bench(args, "inferd-lifecycle-stall-", lambda work: start_daemon(work, args.engine),
                              lambda started, pid: run_bench(args, started["port"]), CLIENT_CPU)
    if results is None:
        return
    print(json.dumps(results, indent=2))
    a, b = results["alone"], results["loading"]
    print(f"\n{args.engine} engine: TTFT of the hot model, p50 / p99 ms ({args.concurrency} clients)")
    print(f"  alone                      {a['ttft_p50_ms']:7.1f} / {a['ttft_p99_ms']:7.1f}   "
          f"({a['requests']} requests)")
    print(f"  while `other` loads        {b['ttft_p50_ms']:7.1f} / {b['ttft_p99_ms']:7.1f}   "
          f"({b['requests']} requests; {b.get('loads', 0)} loads, {b.get('load_s_mean', 0):.2f} s each)")
    print(f"  p99 x{results['p99_ratio']:.2f}, p50 x{results['p50_ratio']:.2f}   goal: p99 <= 1.2x")


if __name__ == "__main__":
    main()
