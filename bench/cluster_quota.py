"""Cluster-wide tenant quotas with real daemons: what the cluster admits of one tenant's tokens per minute.

Used by bench/cluster.py (`--only tpm`, `--only quota`) and tests/daemon/test_cluster_quota.py. Each run
starts N real daemons (bench/cluster_daemons.py: sim engines, profile "tiny" at time_scale 0.01 so a
request costs next to nothing, [cluster] on loopback UDP with shared_quotas) whose one tenant, acme, has
tokens_per_minute = the limit; requests of `max_tokens` + 6 prompt tokens (what the sim tokenizer makes
of the prompt) are sent round-robin over the nodes, paced evenly, `overload` times the limit. Figure:
admitted tokens per minute (usage of the 200s) / the limit, after a warm-up: every node's bucket starts
full (a minute of the limit in all, drained at twice the limit's rate) and that burst is not the steady
state.

  tpm     3 nodes, 46-token requests at 3x a limit of 12,000 tokens/min (about 4.3 req/s per node).
  quota   `--quota-nodes` nodes (8), `--quota-rate` requests/s per node (0.2), 406-token requests, at 3x:
          the limit follows (12,992 tokens/min at the defaults). Few, large requests per node are where a
          node's share of the limit is hardest to get right (docs/cluster.md, "Cluster-wide tenant quotas").

    .venv/bin/python bench/cluster.py --only quota [--quota-nodes 8 --quota-rate 0.2 --quota-max-tokens 400]
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp
from cluster_daemons import detail, start_cluster, stop_cluster, wait_converged  # noqa: E402 (bench/ is on sys.path)
from daemon_process import create_key  # noqa: E402

PROMPT = "count"
PROMPT_TOKENS = 6           # the sim tokenizer's count for PROMPT (each response's usage says so)
TPM_LIMIT = 12_000          # the `tpm` measurement's limit
TPM_MAX_TOKENS = 40


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quota-nodes", type=int, default=8, help="quota: daemons in the cluster")
    p.add_argument("--quota-rate", type=float, default=0.2, help="quota: requests/s offered to each node")
    p.add_argument("--quota-max-tokens", type=int, default=400, help="quota: max_tokens of each request (+6 prompt)")
    p.add_argument("--quota-seconds", type=float, default=100.0, help="quota: the whole run, warm-up included")
    p.add_argument("--quota-warmup", type=float, default=40.0, help="quota: not measured (the buckets start full)")
    p.add_argument("--quota-baseline", action="store_true", help="quota: also run with shared_quotas = false")


async def quota(args: argparse.Namespace, workdir: Path) -> list[str]:
    lines = []
    for shared in (True, False) if args.quota_baseline else (True,):
        out = await cluster_quota_ratio(nodes=args.quota_nodes, rate_per_node=args.quota_rate,
                                        max_tokens=args.quota_max_tokens, seconds=args.quota_seconds,
                                        warmup=args.quota_warmup, shared=shared)
        detail("quota", **out)
        label = f"cluster TPM ratio at {args.quota_rate:g} req/s per node, N={args.quota_nodes}"
        if not shared:
            label += " without shared quotas (baseline)"
        lines.append(f"{label}: {out['ratio']:.2f} (admitted {out['admitted_tpm']:.0f} tokens/min, limit "
                     f"{out['limit_tpm']}, offered {out['offered_tpm']}, {PROMPT_TOKENS + args.quota_max_tokens}"
                     f"-token requests round-robin)")
    return lines


async def cluster_quota_ratio(*, nodes: int, rate_per_node: float, max_tokens: int, seconds: float, warmup: float,
                              overload: float = 3.0, shared: bool = True, limit_tpm: int | None = None) -> dict:
    """One run: `nodes` daemons, `rate_per_node` requests/s each, `overload` times the limit (or, given
    `limit_tpm`, that limit and the rate as given). `shared`: False runs the same with [cluster]
    shared_quotas = false (each node enforces the whole limit): the baseline."""
    cost = PROMPT_TOKENS + max_tokens
    limit = limit_tpm or round(nodes * rate_per_node * 60 * cost / overload)
    with tempfile.TemporaryDirectory(prefix="inferd-quota-") as tmp:
        workdir = Path(tmp)
        key = _keys(workdir)
        auth = (f'[auth]\nmode = "api_key"\nkeys_file = "{workdir / "keys.jsonl"}"\n'
                f"[tenants.acme]\ntokens_per_minute = {limit}\n")
        cluster = start_cluster(workdir, nodes, time_scale=0.01, profile="tiny", batch=64, auth=auth, shared=shared)
        headers = {"Authorization": f"Bearer {key}"}
        try:
            urls = [f"http://127.0.0.1:{n[1]['port']}" for n in cluster]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
                await wait_converged(http, urls, headers, timeout_s=30 + 2 * nodes)
                request = {"model": "m", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True}
                out = await round_robin(http, urls, headers, request, rate=nodes * rate_per_node,
                                        seconds=seconds, warmup=warmup)
        finally:
            stop_cluster(cluster)
    return {"nodes": nodes, "rate_per_node": rate_per_node, "request_tokens": cost, "limit_tpm": limit,
            "shared_quotas": shared, **out, "ratio": out["admitted_tpm"] / limit}


async def cluster_tpm_ratio(seconds: float = 65.0, warmup: float = 35.0, shared: bool = True) -> dict:
    """The `tpm` measurement: 3 nodes, small requests, 3x a limit of TPM_LIMIT."""
    cost = PROMPT_TOKENS + TPM_MAX_TOKENS
    rate = 3 * TPM_LIMIT / 60 / cost
    return await cluster_quota_ratio(nodes=3, rate_per_node=rate / 3, max_tokens=TPM_MAX_TOKENS, seconds=seconds,
                                     warmup=warmup, shared=shared, limit_tpm=TPM_LIMIT)


def _keys(workdir: Path) -> str:
    """Create tenant acme's key in a keys file every node reads; returns the key."""
    keys_file = workdir / "keys.jsonl"
    cfg = workdir / "keys.toml"
    cfg.write_text(f'[auth]\nmode = "api_key"\nkeys_file = "{keys_file}"\n[tenants.acme]\n')
    return create_key(cfg, "acme", "inference", "admin")


async def round_robin(http: aiohttp.ClientSession, urls: list[str], headers: dict, request: dict, *, rate: float,
                      seconds: float, warmup: float) -> dict:
    """`request` at `rate`/s in all, evenly paced, to the nodes in turn, for `seconds`; admitted tokens
    per minute (their usage) after `warmup`, in all and per node, and the offered tokens per minute."""
    admitted: list[tuple[float, int, int]] = []    # (time, tokens, node index)
    statuses: dict[int, int] = {}
    start = time.monotonic()

    async def one(i: int) -> None:
        async with http.post(urls[i % len(urls)] + "/v1/completions", json=request, headers=headers) as resp:
            body = await resp.json()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            if resp.status == 200:
                admitted.append((time.monotonic() - start, body["usage"]["total_tokens"], i % len(urls)))

    tasks, i, sent_at = [], 0, []
    while time.monotonic() - start < seconds:
        sent_at.append(time.monotonic() - start)
        tasks.append(asyncio.ensure_future(one(i)))
        i += 1
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
    await asyncio.gather(*tasks)
    window = seconds - warmup
    steady = [(tokens, node) for t, tokens, node in admitted if t >= warmup]
    per_minute = sum(tokens for tokens, _ in steady) / window * 60
    per_node = [round(sum(tokens for tokens, node in steady if node == k) / window * 60) for k in range(len(urls))]
    per_request = PROMPT_TOKENS + request["max_tokens"]
    offered = sum(1 for t in sent_at if t >= warmup) * per_request / window * 60
    return {"offered_tpm": round(offered), "admitted_tpm": per_minute, "admitted_tpm_per_node": per_node,
            "statuses": statuses, "window_s": window}
