"""Oversized-prompt benchmark: another tenant's latency while two clients send prompts far past the context.

    .venv/bin/python bench/oversized.py [--engine reference|sim] [--seconds 8] [--prompt-kb 900] [--long-kb 30]
                                        [--refused-bytes-per-s N]   # 0: the refusal pacer off

Phases (each bounded by --seconds; the script stops itself and the daemon):
  0. `--engine reference` (default): builds the synthetic `small` model (a real byte-level BPE
     tokenizer, 2,048-token context) into a temp engines root; `--engine sim`: the simulator
     (H100 Llama 3 8B timing, its Python tokenizer, 2,048-token context), a GPU node's shape. API
     keys for tenants `a` (the attacker) and `b`.
  1. The daemon (inferd.daemon.Daemon in a subprocess, uvloop, auth on) pinned to CPU 0; this
     script, the clients, pinned to CPU 1.
  2. `alone`: tenant b sends small completions (a 6-word prompt, 8 greedy tokens) one after
     another; each latency is measured end to end.
  3. `oversized`: the same, while --attackers clients of tenant a each send --prompt-kb of text
     (English-like words, some 200k tokens) in a loop: far past the context, so refused with 400.
  4. `long`: the same, with --long-kb prompts instead: short enough in characters that the daemon
     must tokenize them to find out (then 400 too: ~7k tokens); what the tokenizer pool bounds.
The daemon paces a tenant whose requests keep being refused (inferd.tenancy.refusals, the server's
defaults unless --refused-bytes-per-s is given; 0 turns it off, to see what the rest of the request
path achieves alone). It prints JSON and a summary: b's p50/p99 per phase, the ratio to `alone` (the goal for
`oversized`: p50 <= 1.5x), the attackers' request count, statuses and mean time per request, and the
daemon's peak RSS. Loopback only. Run it against another checkout with PYTHONPATH=that/checkout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import time
from pathlib import Path

from daemon_process import cpu_seconds, create_key, daemon_or_bench, spawn  # noqa: E402 (bench/ is this script's own directory)

SERVER_CPU, CLIENT_CPU = 0, 1

CONFIG = """
[server]
host = "127.0.0.1"
port = 0
engines_root = "{engines}"
log_level = "info"
{pacing}
[auth]
mode = "api_key"
keys_file = "keys.jsonl"

[audit]
path = "audit.jsonl"

{model}
[tenants.a]
[tenants.b]
"""
MODELS = {
    # NumPy on the daemon's own CPU: b's requests already keep that CPU busy, so whatever the attack
    # costs the daemon comes straight out of b's latency (the worst case).
    "reference": """
[models.small]
backend = "reference"
artifact = "small"
max_batch_size = 8
max_num_tokens = 512
num_kv_blocks = 1024
block_size = 16
""",
    # A GPU node: engine time is simulated (H100, Llama 3 8B), so the daemon's CPU is the front end's.
    "sim": """
[models.small]
backend = "sim"
max_batch_size = 8
max_num_tokens = 512
num_kv_blocks = 1024

[models.small.sim]
profile = "llama3-8b-h100"
time_scale = 1.0
max_model_len = 2048
""",
}
B_BODY = {"model": "small", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
WORDS = ("the of and to in is that it was for on are as with his they at be this from have or by one had not "
         "but what all were when we there can an your which their said if do will each about how up out them "
         "model token server request stream queue tenant engine batch cache block prompt answer question").split()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def text_of(kb: int, seed: int) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < kb * 1000:
        w = rng.choice(WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)


def start_daemon(workdir: Path, engine: str, refused_bytes_per_s: float | None) -> tuple[subprocess.Popen, dict]:
    from inferd.artifacts.build.reference import build_synthetic

    engines = workdir / "engines"
    if engine == "reference":
        build_synthetic("small", engines, progress=lambda message: None)
    config = workdir / "inferd.toml"
    pacing = "" if refused_bytes_per_s is None else f"refused_bytes_per_s = {refused_bytes_per_s}\n"
    config.write_text(CONFIG.format(engines=engines, model=MODELS[engine], pacing=pacing))
    keys = {tenant: create_key(config, tenant, cwd=workdir) for tenant in ("a", "b")}
    proc, started = spawn([__file__, "--role", "daemon", "--config", str(config)], workdir, "daemon.log", SERVER_CPU)
    return proc, {**started, "keys": keys}


# -- the clients -----------------------------------------------------------------------------------
async def tenant_b(http, url: str, key: str, seconds: float) -> list[float]:
    """Small requests one after another for `seconds`; their latencies (every one must succeed)."""
    headers = {"Authorization": f"Bearer {key}"}
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        async with http.post(url, json=B_BODY, headers=headers) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"tenant b got {resp.status}: {await resp.text()}")
        latencies.append(time.perf_counter() - t0)
    return latencies


async def attacker(http, url: str, key: str, body: bytes, stop_at: asyncio.Event, seen: dict) -> None:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    while not stop_at.is_set():
        t0 = time.perf_counter()
        async with http.post(url, data=body, headers=headers) as resp:
            await resp.read()
            seen["statuses"][resp.status] = seen["statuses"].get(resp.status, 0) + 1
        seen["seconds"].append(time.perf_counter() - t0)


async def phase(http, url: str, keys: dict, seconds: float, attackers: int, prompt: str | None, pid: int) -> dict:
    seen: dict = {"statuses": {}, "seconds": []}
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    stop_at = asyncio.Event()
    tasks = []
    if prompt is not None:
        body = json.dumps({"model": "small", "prompt": prompt, "max_tokens": 8}).encode()
        tasks = [asyncio.ensure_future(attacker(http, url, keys["a"], body, stop_at, seen)) for _ in range(attackers)]
        await asyncio.sleep(0.5)      # a load generator's warm-up: the attack is under way before b measures
    try:
        lat = await asyncio.wait_for(tenant_b(http, url, keys["b"], seconds), seconds + 60)
    finally:
        stop_at.set()
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
    daemon_cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
    lat.sort()
    out = {"daemon_cpu": daemon_cpu, "b_requests": len(lat), "b_p50_ms": 1000 * statistics.median(lat),
           "b_p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}
    if prompt is not None:
        out.update(prompt_bytes=len(prompt.encode()), attacker_requests=len(seen["seconds"]),
                   attacker_statuses=seen["statuses"],
                   attacker_mean_ms=1000 * statistics.fmean(seen["seconds"]) if seen["seconds"] else None)
    return out


async def run_bench(args: argparse.Namespace, port: int, keys: dict, pid: int) -> dict:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    oversized, long = text_of(args.prompt_kb, 1), text_of(args.long_kb, 2)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await tenant_b(http, url, keys["b"], 1.0)        # warm-up: first requests pay one-time costs
        results = {"alone": await phase(http, url, keys, args.seconds, 0, None, pid)}
        results["oversized"] = await phase(http, url, keys, args.seconds, args.attackers, oversized, pid)
        results["long"] = await phase(http, url, keys, args.seconds, args.attackers, long, pid)
    for name in ("oversized", "long"):
        results[name]["p50_ratio"] = results[name]["b_p50_ms"] / results["alone"]["b_p50_ms"]
    results["daemon_peak_rss_mb"] = peak_rss_mb(pid)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", default="bench", choices=("bench", "daemon"))
    parser.add_argument("--config", type=Path)
    parser.add_argument("--seconds", type=float, default=8.0, help="per phase")
    parser.add_argument("--prompt-kb", type=int, default=900)
    parser.add_argument("--long-kb", type=int, default=30)
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--engine", default="reference", choices=tuple(MODELS))
    parser.add_argument("--refused-bytes-per-s", type=float, default=None,
                        help="server.refused_bytes_per_s (default: the daemon's; 0: no pacing of refused requests)")
    args = parser.parse_args()
    results = daemon_or_bench(args, "inferd-oversized-",
                              lambda work: start_daemon(work, args.engine, args.refused_bytes_per_s),
                              lambda started, pid: run_bench(args, started["port"], started["keys"], pid), CLIENT_CPU)
    if results is None:
        return
    print(json.dumps(results, indent=2))
    pacing = "default" if args.refused_bytes_per_s is None else f"{args.refused_bytes_per_s:g} B/s"
    print(f"\n{args.engine} engine, inferd from {results['inferd']}, refusal pacing {pacing}; "
          f"tenant b, small completions (p50 / p99 ms):")
    print(f"  alone                               {results['alone']['b_p50_ms']:8.1f} / "
          f"{results['alone']['b_p99_ms']:8.1f}            daemon CPU {results['alone']['daemon_cpu']:.0%}")
    for name, what in (("oversized", f"{args.prompt_kb} KB prompts"), ("long", f"{args.long_kb} KB prompts")):
        r = results[name]
        print(f"  {args.attackers} clients sending {what:<13} {r['b_p50_ms']:8.1f} / {r['b_p99_ms']:8.1f}   "
              f"p50 x{r['p50_ratio']:.2f}   daemon CPU {r['daemon_cpu']:.0%}   (their {r['attacker_requests']} "
              f"requests: {r['attacker_statuses']}, {r['attacker_mean_ms']:.0f} ms each)")
    print(f"  daemon peak RSS {results['daemon_peak_rss_mb']:.0f} MB;  goal: oversized p50 ratio <= 1.5")


if __name__ == "__main__":
    main()
