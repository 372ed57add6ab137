"""Upload flood benchmark: tenant alpha's small requests alone, then while tenant beta uploads big batch
files (POST /v1/files) at once; the daemon's memory through it.

    .venv/bin/python bench/upload_flood.py [--size-mb 90] [--uploads 4] [--seconds 10] [--rate 50]

The issue's promise: an upload's memory is O(chunk), not O(file), and uploads do not stall other
tenants. Setup: the real daemon (inferd.daemon.Daemon in a subprocess, uvloop, auth on, SQLite store)
pinned to CPU 0, this script's clients to CPU 1; one sim model (time_scale 0: the engine costs nothing,
what is measured is the daemon's loop and store). Tenants `alpha` and `beta` with default limits, keys
from `inferd keys create`.
  1. `alone`: alpha sends small completions (4 tokens; each one a ledger row committed through the store)
     at --rate per second, open loop (an innocent tenant's steady traffic, not a saturating one) for
     --seconds; per request the end-to-end latency.
  2. `uploads`: the same traffic while beta sends --uploads concurrent uploads of a --size-mb JSONL file
     (valid batch lines of ~2 KB), measured from the first upload's start to the last one's answer.
The RSS of the daemon's process tree (/proc: the daemon and its uploads' line worker) is sampled every 20 ms; its growth is the peak during the uploads over the RSS
before them. Prints JSON, then the named lines `alpha p99 alone`, `alpha p99 during uploads`,
`p99 ratio` (goal <= 1.5x) and `peak RSS growth` (goal < 200 MB). --size-mb 8 makes a quick run.
Run it against another checkout with PYTHONPATH=that/checkout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from daemon_process import create_key, daemon_or_bench, spawn  # noqa: E402 (bench/ is this script's own directory)

SERVER_CPU, CLIENT_CPU = 0, 1
RATIO_GOAL, RSS_GOAL_MB = 1.5, 200.0

CONFIG = """
[server]
host = "127.0.0.1"
port = 0
log_level = "warning"

[auth]
mode = "api_key"
keys_file = "keys.jsonl"

[audit]
path = "audit.jsonl"

[models.sim]
backend = "sim"
max_batch_size = 64
max_num_tokens = 4096

[models.sim.sim]
profile = "tiny"
time_scale = 0.0

[tenants.alpha]
[tenants.beta]
"""
SMALL = {"model": "sim", "prompt": "hello there", "max_tokens": 4}


def start_daemon(workdir: Path) -> tuple[subprocess.Popen, dict]:
    config = workdir / "inferd.toml"
    config.write_text(CONFIG)
    keys = {t: create_key(config, t, "inference", cwd=workdir) for t in ("alpha", "beta")}
    proc, started = spawn([__file__, "--role", "daemon", "--config", str(config)], workdir, "daemon.log", SERVER_CPU)
    return proc, {**started, "keys": keys}


def batch_file(size: int) -> bytes:
    """A valid batch input of about `size` bytes: lines of ~2 KB (50,000 lines at most: ~100 MB)."""
    lines, total, i = [], 0, 0
    while total < size:
        line = json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                           "body": {"model": "sim", "max_tokens": 4,
                                    "messages": [{"role": "user", "content": "x" * 1900}]}}).encode() + b"\n"
        lines.append(line)
        total += len(line)
        i += 1
    return b"".join(lines)


def rss_mb(pid: int) -> float:
    """The RSS of the daemon and its children (the uploads' line worker), summed."""
    total = 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += rss_mb(int(child))
    except (FileNotFoundError, ProcessLookupError):
        pass            # a process that ended while being read
    return total


async def sample_rss(pid: int, peak: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_mb(pid))
        await asyncio.sleep(0.02)


async def alpha_clients(http, base: str, key: str, rate: float, until: asyncio.Event) -> tuple[list[float], dict]:
    """Small completions sent at `rate` per second (open loop: each on time, whatever the others do) until
    `until` is set: latencies (s) of the 200s, statuses counted."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def one() -> None:
        start = time.perf_counter()
        async with http.post(base + "/v1/completions", json=SMALL,
                             headers={"Authorization": f"Bearer {key}"}) as resp:
            await resp.read()
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        if resp.status == 200:
            latencies.append(time.perf_counter() - start)
    sent, begin, tasks = 0, time.perf_counter(), []
    while not until.is_set():
        tasks.append(asyncio.ensure_future(one()))
        sent += 1
        await asyncio.sleep(max(0.0, begin + sent / rate - time.perf_counter()))
    await asyncio.gather(*tasks)
    return latencies, statuses


async def uploads(base: str, key: str, size_mb: float, count: int) -> list[tuple[int, str]]:
    """`count` concurrent uploads of one file (in the uploader process)."""
    import aiohttp

    content = batch_file(int(size_mb * 1_000_000))

    async def one(http, n: int) -> tuple[int, str]:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content, filename=f"big-{n}.jsonl", content_type="application/jsonl")
        async with http.post(base + "/v1/files", data=form, headers={"Authorization": f"Bearer {key}"}) as resp:
            return resp.status, (await resp.text())[:200]
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        return await asyncio.gather(*(one(http, n) for n in range(count)))


async def run_uploader(base: str, key: str, args: argparse.Namespace) -> tuple[list[tuple[int, str]], float, float]:
    """Beta's uploads from a process of their own (its loop busy sending never delays alpha's clock):
    (answers, seconds from its go to the last answer, file MB)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--role", "uploader", "--url", base, "--key", key, "--size-mb", str(args.size_mb),
        "--uploads", str(args.uploads), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert (await proc.stdout.readline()).strip() == b"ready"       # the file is built: go
    start = time.perf_counter()
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    out = json.loads(await proc.stdout.readline())
    await proc.wait()
    return out["answers"], time.perf_counter() - start, out["file_mb"]


def uploader_main(args: argparse.Namespace) -> None:
    batch_file(int(args.size_mb * 1_000_000))       # warm: the real one is built again, the same
    print("ready", flush=True)
    sys.stdin.readline()
    answers = asyncio.run(uploads(args.url, args.key, args.size_mb, args.uploads))
    print(json.dumps({"answers": answers, "file_mb": round(len(batch_file(int(args.size_mb * 1e6))) / 1e6, 1)}),
          flush=True)


def p99_ms(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2)


async def bench(started: dict, pid: int, args: argparse.Namespace) -> dict:
    import aiohttp

    base, keys = f"http://127.0.0.1:{started['port']}", started["keys"]
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        warm = asyncio.Event()
        asyncio.get_running_loop().call_later(2.0, warm.set)
        await alpha_clients(http, base, keys["alpha"], args.rate, warm)
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(args.seconds, done.set)
        alone, alone_statuses = await alpha_clients(http, base, keys["alpha"], args.rate, done)
        before, peak, stop = rss_mb(pid), [0.0], asyncio.Event()
        sampler = asyncio.ensure_future(sample_rss(pid, peak, stop))
        uploads_done = asyncio.Event()
        flood = asyncio.ensure_future(run_uploader(base, keys["beta"], args))
        during = asyncio.ensure_future(alpha_clients(http, base, keys["alpha"], args.rate, uploads_done))
        answers, upload_s, file_mb = await flood
        uploads_done.set()
        loaded, loaded_statuses = await during
        stop.set()
        await sampler
        after = rss_mb(pid)
    return {"file_mb": file_mb, "uploads": args.uploads, "upload_s": round(upload_s, 2),
            "upload_statuses": [s for s, _ in answers], "upload_errors": [t for s, t in answers if s != 200],
            "alpha_alone": {"requests": len(alone), "statuses": alone_statuses, "p99_ms": p99_ms(alone)},
            "alpha_during": {"requests": len(loaded), "statuses": loaded_statuses, "p99_ms": p99_ms(loaded)},
            "rss_mb": {"before": round(before, 1), "peak": round(peak[0], 1), "after": round(after, 1)}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["main", "daemon", "uploader"], default="main")
    p.add_argument("--url")
    p.add_argument("--key")
    p.add_argument("--config", type=Path)
    p.add_argument("--size-mb", type=float, default=90.0, help="each upload's size (8: a quick run)")
    p.add_argument("--uploads", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0, help="the `alone` phase")
    p.add_argument("--rate", type=float, default=50.0, help="alpha's small requests per second")
    args = p.parse_args()
    if args.role == "uploader":
        uploader_main(args)
        return 0
    result = daemon_or_bench(args, "inferd-upload-flood-", start_daemon,
                             lambda started, pid: bench(started, pid, args), client_cpu=CLIENT_CPU)
    if result is None:
        return 0
    print(json.dumps(result, indent=2))
    alone, during = result["alpha_alone"]["p99_ms"], result["alpha_during"]["p99_ms"]
    growth = result["rss_mb"]["peak"] - result["rss_mb"]["before"]
    ratio = during / alone if alone and during else float("nan")
    print(f"uploads: {args.uploads} x {result['file_mb']} MB in {result['upload_s']} s, "
          f"statuses {result['upload_statuses']}")
    print(f"alpha p99 alone: {alone} ms")
    print(f"alpha p99 during uploads: {during} ms")
    print(f"p99 ratio: {ratio:.2f}x (goal <= {RATIO_GOAL}x)")
    print(f"peak RSS growth: {growth:.1f} MB (goal < {RSS_GOAL_MB:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
