"""Rollback latency through the real daemon: from the moment a canary breach is recorded to the first
instant after which every new request is routed to stable.

The daemon (in this process, real app on a loopback port) serves one model with two sim versions,
`stable` and `cand`; the candidate costs 3x per 1k tokens, so the cost check breaches once both
windows hold `min_samples` requests. Clients send steady traffic to the alias `chat` (distinct `user`s).
We timestamp (1) the first `breaches()` call that returns a breach and (2) every routing decision
the daemon makes; the figure is max(0, last routing to the candidate - breach). Bounded: stops
`--after-s` seconds after the rollback, or after `--timeout-s`.

    .venv/bin/python bench/rollback_latency.py [--clients 8] [--runs 3]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferd.config import load_config  # noqa: E402
from inferd.daemon import Daemon  # noqa: E402
from inferd.observability import configure_logging  # noqa: E402
from inferd.types import ModelVersion  # noqa: E402

CONFIG = '''
[server]
port = 0
drain_grace_s = 5.0
[audit]
path = "audit.jsonl"
[models.m]
backend = "sim"
versions = ["stable", "cand"]
max_batch_size = 64
max_num_tokens = 1024
num_kv_blocks = 2048
[models.m.sim]
profile = "tiny"
time_scale = {time_scale}
max_model_len = 2048
[aliases.chat]
split = {{ "m@stable" = 1 }}
[rollouts.chat]
stable = "m@stable"
candidate = "m@cand"
steps = [0.25, 1.0]
min_dwell_s = 600
start = "on_load"
[rollouts.chat.thresholds]
min_samples = {min_samples}
max_ttft_p95_ratio = 1000
max_itl_p95_ratio = 1000
latency_slack_s = 1.0
[prices."m@stable"]
prompt_per_1k = 0.001
completion_per_1k = 0.002
[prices."m@cand"]
prompt_per_1k = 0.003
completion_per_1k = 0.006
'''

CAND = ModelVersion("m", "cand")


async def one_run(args: argparse.Namespace, workdir: Path) -> dict:
    path = workdir / "config.toml"
    path.write_text(CONFIG.format(time_scale=args.time_scale, min_samples=args.min_samples))
    daemon = Daemon(load_config(path), config_path=path)
    task = asyncio.ensure_future(daemon.run())
    await daemon.ready.wait()
    url = f"http://127.0.0.1:{daemon.port}/v1/completions"
    rollout = daemon.control.rollouts.get("chat")
    breach_at: list[float] = []
    routed: list[tuple[float, ModelVersion]] = []

    breaches = rollout.breaches

    def timed_breaches() -> list[str]:
        out = breaches()
        if out and not breach_at:
            breach_at.append(time.monotonic())
        return out

    rollout.breaches = timed_breaches
    registry = daemon.state.registry
    resolve = registry.resolve

    def timed_resolve(*a, **kw):
        route = resolve(*a, **kw)
        routed.append((time.monotonic(), route.target))
        return route

    registry.resolve = timed_resolve
    swap = registry.swap
    swapped_at: list[float] = []

    def timed_swap(change):
        table = swap(change)
        if breach_at and not swapped_at:
            swapped_at.append(time.monotonic())   # the routing table every later request reads
        return table

    registry.swap = timed_swap
    done_at: list[float] = []
    statuses: dict[int, int] = {}

    async def client(i: int, http: aiohttp.ClientSession) -> None:
        n = 0
        while True:
            if done_at and time.monotonic() > done_at[0] + args.after_s:
                return
            body = {"model": "chat", "prompt": "hello there", "max_tokens": args.max_tokens, "user": f"u{i}-{n}"}
            async with http.post(url, json=body) as resp:
                await resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1
            n += 1
            if rollout.phase == "rolled_back" and not done_at:
                done_at.append(time.monotonic())

    t0 = time.monotonic()
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.wait_for(asyncio.gather(*(client(i, http) for i in range(args.clients))), args.timeout_s)
    except asyncio.TimeoutError:
        pass
    finally:
        daemon.request_stop()
        await task
    if not breach_at:
        return {"rolled_back": False, "requests": len(routed), "statuses": statuses}
    b = breach_at[0]
    last_cand = max((t for t, k in routed if k == CAND), default=b)
    after = [k for t, k in routed if t > b]
    # Every request routed after the swap reads the new table; a candidate routing later would extend it.
    stable_from = max(swapped_at[0] if swapped_at else b, last_cand)
    return {"rolled_back": rollout.phase == "rolled_back", "latency_s": stable_from - b,
            "breach_after_s": b - t0, "candidate_after_breach": sum(1 for k in after if k == CAND),
            "requests_after_breach": len(after), "requests": len(routed), "statuses": statuses,
            "reason": rollout.reason}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--min-samples", type=int, default=50)
    parser.add_argument("--after-s", type=float, default=1.0, help="traffic kept up after the rollback")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per-run bound")
    args = parser.parse_args()
    configure_logging("warning")
    results = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            r = await one_run(args, Path(tmp))
        results.append(r)
        if r["rolled_back"]:
            print(f"run {run + 1}: breach after {r['breach_after_s']:.2f}s of traffic; rollback latency "
                  f"{r['latency_s'] * 1e6:.0f} us; candidate routings after the breach: "
                  f"{r['candidate_after_breach']} of {r['requests_after_breach']}; statuses {r['statuses']}")
        else:
            print(f"run {run + 1}: no rollback within {args.timeout_s}s ({r['requests']} requests)")
    lat = [r["latency_s"] for r in results if r.get("rolled_back")]
    if lat:
        print(f"rollback latency (breach recorded -> every new request on stable): "
              f"max {max(lat) * 1e6:.0f} us, median {statistics.median(lat) * 1e6:.0f} us over {len(lat)} runs "
              f"(target < 1000 ms)")


if __name__ == "__main__":
    asyncio.run(main())
