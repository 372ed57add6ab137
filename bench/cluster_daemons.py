"""Cluster measurements that need whole daemons: starting and stopping them, and the cluster-wide TPM.

Used by bench/cluster.py (`--only tpm`) and bench/cluster_spill.py (`--only spillover`, streamed TTFT);
each measurement starts three real daemons (inferd.daemon.Daemon in subprocesses, sim engines,
[cluster] on loopback UDP), drives them with a bounded load from this process, stops them and returns
its figures.

cluster_tpm_ratio: one tenant with tokens_per_minute = LIMIT sends round-robin over the three nodes
at three times that limit; admitted tokens per minute (usage of the 200s) / limit, measured after
the first `--tpm-warmup` seconds (every bucket starts full: that first burst is not the steady state).
"""
from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
from daemon_process import create_key, spawn, stop  # noqa: E402 (bench/ is this script's own directory)

KEY = "5e" * 32
MODEL = """
[models.m]
backend = "sim"
max_batch_size = {batch}
max_num_tokens = 512
[models.m.sim]
profile = "{profile}"
time_scale = {time_scale}
max_model_len = 4096
"""
CLUSTER = """
[cluster]
bind_port = 0
key_file = "{key}"
seeds = [{seeds}]
probe_interval_s = 0.2
probe_timeout_s = 0.1
spillover = {spillover}
spill_wait_s = {spill_wait}
shared_quotas = {shared}
"""


def _config(workdir: Path, i: int, seeds: str, *, spillover: bool = True, spill_wait: float = 1.0,
            profile: str = "llama3-8b-h100", time_scale: float = 1.0, batch: int = 8, auth: str = "",
            shared: bool = True) -> Path:
    d = workdir / f"node{i}"
    d.mkdir(exist_ok=True)
    text = (f'[server]\nport = 0\nlog_level = "warning"\nstate_dir = "state"\n{auth}'
            + MODEL.format(batch=batch, profile=profile, time_scale=time_scale)
            + CLUSTER.format(key=workdir / "cluster.key", seeds=seeds, spillover=str(spillover).lower(),
                             spill_wait=spill_wait, shared=str(shared).lower()))
    (d / "inferd.toml").write_text(text)
    return d / "inferd.toml"


def start_cluster(workdir: Path, n: int, **config) -> list[tuple[subprocess.Popen, dict]]:
    """n daemons; node 0 is every other's seed. Each entry: (process, {"port", "gossip", "node_id"})."""
    (workdir / "cluster.key").write_text(KEY)
    nodes, seeds = [], ""
    bench = str(Path(__file__).with_name("cluster.py"))
    try:
        for i in range(n):
            path = _config(workdir, i, seeds, **config)
            nodes.append(spawn([bench, "--role", "daemon", "--config", str(path)], path.parent, "daemon.log"))
            if i == 0:
                seeds = f'"{nodes[0][1]["gossip"]}"'
    except BaseException:
        stop_cluster(nodes)
        raise
    return nodes


def stop_cluster(nodes: list[tuple[subprocess.Popen, dict]]) -> None:
    for proc, _ in nodes:
        stop(proc, timeout=10)


async def wait_converged(http: aiohttp.ClientSession, urls: list[str], headers: dict, timeout_s: float = 20) -> None:
    """Until every node sees every other alive with a fresh load hint."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ok = True
        for url in urls:
            async with http.get(url + "/admin/peers", headers=headers) as resp:
                view = await resp.json()
            ok &= sum(p["state"] == "alive" and "m" in p["models"] for p in view["peers"]) == len(urls) - 1
        if ok:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the cluster did not converge")


# -- cluster-wide TPM ---------------------------------------------------------------------------
TPM_LIMIT = 12_000
TPM_REQUEST = {"model": "m", "prompt": "count", "max_tokens": 40, "temperature": 0, "ignore_eos": True}


def _keys(workdir: Path) -> str:
    """Create tenant acme's key in a keys file all three nodes read; returns the key."""
    keys_file = workdir / "keys.jsonl"
    cfg = workdir / "keys.toml"
    cfg.write_text(f'[auth]\nmode = "api_key"\nkeys_file = "{keys_file}"\n[tenants.acme]\n')
    return create_key(cfg, "acme", "inference", "admin")


async def cluster_tpm_ratio(seconds: float = 65.0, warmup: float = 35.0, shared: bool = True) -> dict:
    """`shared`: False runs the same with [cluster] shared_quotas = false (each node enforces the whole
    limit, as before this feature): the baseline."""
    with tempfile.TemporaryDirectory(prefix="inferd-tpm-") as tmp:
        workdir = Path(tmp)
        key = _keys(workdir)
        auth = (f'[auth]\nmode = "api_key"\nkeys_file = "{workdir / "keys.jsonl"}"\n'
                f"[tenants.acme]\ntokens_per_minute = {TPM_LIMIT}\n")
        nodes = start_cluster(workdir, 3, time_scale=0.01, profile="tiny", batch=64, auth=auth, shared=shared)
        headers = {"Authorization": f"Bearer {key}"}
        try:
            urls = [f"http://127.0.0.1:{n[1]['port']}" for n in nodes]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
                await wait_converged(http, urls, headers)
                return await _round_robin(http, urls, headers, seconds, warmup)
        finally:
            stop_cluster(nodes)


async def _round_robin(http: aiohttp.ClientSession, urls: list[str], headers: dict, seconds: float,
                       warmup: float) -> dict:
    cost = 6 + TPM_REQUEST["max_tokens"]          # the sim tokenizer makes 6 tokens of the prompt (usage says)
    rate = 3 * TPM_LIMIT / 60 / cost               # requests per second: three times the limit
    admitted: list[tuple[float, int, int]] = []    # (time, tokens, node index)
    statuses: dict[int, int] = {}
    start = time.monotonic()

    async def one(i: int) -> None:
        async with http.post(urls[i % len(urls)] + "/v1/completions", json=TPM_REQUEST, headers=headers) as resp:
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
    per_node = [sum(tokens for tokens, node in steady if node == k) / window * 60 for k in range(len(urls))]
    per_request = sum(tokens for _, tokens, _ in admitted) / max(1, len(admitted))      # what one request costs
    offered = sum(1 for t in sent_at if t >= warmup) * per_request / window * 60
    return {"limit_tpm": TPM_LIMIT, "offered_tpm": round(offered), "admitted_tpm": per_minute,
            "admitted_tpm_per_node": per_node, "statuses": statuses, "ratio": per_minute / TPM_LIMIT,
            "window_s": window}
