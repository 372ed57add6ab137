"""The delay a completed stream's `[DONE]` pays on loopback: from the frame with its finish_reason to `[DONE]`,
as the client reads them. It holds the ledger's commit and the wait for the client's acknowledgement of the
content (inferd.api.streaming.accepted); with a client reading along the wait should cost nothing.

    .venv/bin/python bench/stream_done_delay.py [--streams 200] [--concurrency 8]

Prints `done_delay_p50_ms`, `done_delay_p99_ms` and `done_delay_max_ms` (a sim model, a SQLite ledger).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from in_process import daemon_in_process  # noqa: E402 (bench/ is this script's own directory)

BODY = {"model": "sim", "prompt": "hello there", "max_tokens": 64, "ignore_eos": True, "stream": True}


def config(state: Path) -> str:
    return (f'[server]\nport = 0\nstate_dir = "{state}"\n[audit]\npath = "{state}/audit.jsonl"\n'
            '[models.sim]\nbackend = "sim"\nmax_batch_size = 64\nmax_num_tokens = 256\nnum_kv_blocks = 1024\n'
            '[models.sim.sim]\nprofile = "tiny"\ntime_scale = 0.01\nmax_model_len = 2048\n')


async def one(http: aiohttp.ClientSession, url: str) -> float:
    finished = None
    async with http.post(url + "/v1/completions", json=BODY) as resp:
        async for line in resp.content:
            if b'"finish_reason":"' in line.replace(b" ", b""):
                finished = time.perf_counter()
            elif line.startswith(b"data: [DONE]"):
                return time.perf_counter() - finished
    raise RuntimeError("no [DONE]")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    async with daemon_in_process(config, "inferd-done-delay-") as (_, url, _), aiohttp.ClientSession() as http:
        await one(http, url)                    # warm-up
        delays: list[float] = []

        async def worker(n: int) -> None:
            for _ in range(n):
                delays.append(await one(http, url))
        await asyncio.gather(*(worker(args.streams // args.concurrency) for _ in range(args.concurrency)))
    ms = sorted(d * 1000 for d in delays)
    print(f"done_delay_p50_ms: {statistics.median(ms):.2f}")
    print(f"done_delay_p99_ms: {ms[int(len(ms) * 0.99) - 1]:.2f}")
    print(f"done_delay_max_ms: {ms[-1]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
