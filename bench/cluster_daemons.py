"""Clusters of real daemons for the benchmarks, and the spillover measurement (the cluster-wide quota
measurements are bench/cluster_quota.py's).

Used by bench/cluster.py (`--only spillover`, `--only tpm`, `--only quota`): start_cluster runs real
daemons (inferd.daemon.Daemon in subprocesses, sim engines, [cluster] on loopback UDP); each measurement
drives them with a bounded load from this process, stops them and returns its figures.

spillover_goodput: every request goes to node 0, at twice the capacity measured on node 0 alone
(closed loop, `--capacity-seconds`); goodput = requests answered 200 within the SLO per second,
with spillover on (nodes 1 and 2 idle until node 0 spills to them) vs the same run with it off.
"""
from __future__ import annotations

import asyncio
import random
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
from daemon_process import spawn, stop  # noqa: E402 (bench/ is this script's own directory)

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
bind_port = {bind_port}
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
            shared: bool = True, cluster_extra: str = "", bind_port: int = 0) -> Path:
    d = workdir / f"node{i}"
    d.mkdir(exist_ok=True)
    text = (f'[server]\nport = 0\nlog_level = "warning"\nstate_dir = "state"\n{auth}'
            + MODEL.format(batch=batch, profile=profile, time_scale=time_scale)
            + CLUSTER.format(key=workdir / "cluster.key", seeds=seeds, bind_port=bind_port,
                             spillover=str(spillover).lower(), spill_wait=spill_wait, shared=str(shared).lower())
            + cluster_extra)
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


# -- spillover goodput --------------------------------------------------------------------------
REQUEST = {"model": "m", "prompt": "Summarise the plot of a long novel in a few sentences.", "max_tokens": 128,
           "temperature": 0, "ignore_eos": True}


async def _closed_loop(http: aiohttp.ClientSession, url: str, clients: int, seconds: float) -> float:
    """Completions per second with `clients` sending back to back for `seconds`."""
    done = 0
    end = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < end:
            async with http.post(url, json=REQUEST) as resp:
                await resp.read()
                done += resp.status == 200

    t0 = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / (time.monotonic() - t0)


async def _open_loop(http: aiohttp.ClientSession, url: str, rate: float, seconds: float, slo_s: float,
                     seed: int) -> dict:
    """Poisson arrivals at `rate`/s for `seconds`; each request may take at most `slo_s` (X-Request-Timeout)."""
    rng = random.Random(seed)
    results: list[tuple[int, float, str]] = []
    headers = {"X-Request-Timeout": str(slo_s)}

    async def one() -> None:
        t0 = time.monotonic()
        try:
            async with http.post(url, json=REQUEST, headers=headers) as resp:
                await resp.read()
                results.append((resp.status, time.monotonic() - t0, resp.headers.get("X-Inferd-Node", "?")))
        except aiohttp.ClientError:
            results.append((0, time.monotonic() - t0, "?"))

    tasks, t, start = [], 0.0, time.monotonic()
    while t < seconds:
        t += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, start + t - time.monotonic()))
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.wait_for(asyncio.gather(*tasks), slo_s + 30)
    good = sum(1 for status, took, _ in results if status == 200 and took <= slo_s)
    by_node: dict[str, int] = {}
    for status, _, node in results:
        if status == 200:
            by_node[node] = by_node.get(node, 0) + 1
    statuses: dict[int, int] = {}
    for status, _, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    return {"sent": len(results), "goodput_per_s": good / seconds, "statuses": statuses, "served_by": by_node}


async def spillover_goodput(seconds: float = 30.0, capacity_seconds: float = 8.0, slo_s: float = 5.0) -> dict:
    out: dict = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        for spillover in (False, True):
            with tempfile.TemporaryDirectory(prefix="inferd-spill-") as tmp:
                nodes = start_cluster(Path(tmp), 3, spillover=spillover, spill_wait=1.0)
                try:
                    urls = [f"http://127.0.0.1:{n[1]['port']}" for n in nodes]
                    await wait_converged(http, urls, {})
                    url = urls[0] + "/v1/completions"
                    if "capacity_per_s" not in out:
                        out["capacity_per_s"] = await _closed_loop(http, url, 16, capacity_seconds)
                    rate = 2 * out["capacity_per_s"]
                    out["on" if spillover else "off"] = await _open_loop(http, url, rate, seconds, slo_s, seed=7)
                finally:
                    stop_cluster(nodes)
    out["offered_per_s"] = 2 * out["capacity_per_s"]
    out["slo_s"] = slo_s
    out["ratio"] = out["on"]["goodput_per_s"] / max(1e-9, out["off"]["goodput_per_s"])
    return out
