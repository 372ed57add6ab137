"""Response cache hit latency: identical greedy requests, the first a miss, the rest hits.

One real Daemon in this process serves a simulated Llama-3-8B on an H100 (real time) to one tenant
that opted in. Sequential requests on one keep-alive connection over loopback; for hits and misses it
prints the p50/p99 of the server's own time (Server-Timing `total`, arrival to response) and of the
client's round trip. Goal: hits served within 1 ms p50.

    python bench/cache.py [--requests 500] [--max-tokens 64]
"""
from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time

import aiohttp

from in_process import daemon_in_process  # noqa: E402 (bench/ is this script's own directory)

CONFIG = """
[server]
port = 0
log_level = "error"
state_dir = "{state}"
[models.llama]
backend = "sim"
max_batch_size = 64
[models.llama.sim]
profile = "llama3-8b-h100"
[tenants.local]
cache_responses = true
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args) -> None:
    results: dict[str, tuple[list[float], list[float]]] = {"hit": ([], []), "miss": ([], [])}
    async with daemon_in_process(lambda state: CONFIG.format(state=state), "inferd-cache-bench-") as (_, base, _):
        url = base + "/v1/completions"
        async with aiohttp.ClientSession() as http:
            for i in range(args.requests):
                body = {"model": "llama", "prompt": f"question {i % args.distinct}", "max_tokens": args.max_tokens,
                        "temperature": 0}
                start = time.perf_counter()
                async with http.post(url, json=body) as resp:
                    await resp.read()
                    client = time.perf_counter() - start
                    server = float(re.search(r"total;dur=([0-9.]+)", resp.headers["Server-Timing"]).group(1)) / 1000
                    server_list, client_list = results[resp.headers["X-Inferd-Cache"]]
                    server_list.append(server)
                    client_list.append(client)
    for kind, (server, client) in results.items():
        if server:
            print(f"{kind}: {len(server)} requests; server p50 {pct(server, .5) * 1000:.3f} ms, p99 "
                  f"{pct(server, .99) * 1000:.3f} ms; client round trip p50 {pct(client, .5) * 1000:.3f} ms, "
                  f"p99 {pct(client, .99) * 1000:.3f} ms")
    hits, misses = results["hit"][0], results["miss"][0]
    if hits and misses:
        print(f"hit/miss server p50: {statistics.median(hits) / statistics.median(misses):.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--distinct", type=int, default=10, help="distinct prompts (the first of each misses)")
    parser.add_argument("--max-tokens", type=int, default=64)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(parser.parse_args()))
