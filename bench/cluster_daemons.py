"""Clusters of real daemons for the benchmarks: starting, stopping and waiting for them to converge.

Used by bench/cluster_spill.py (`--only spillover`), bench/cluster_quota.py (`--only tpm`, `--only quota`),
bench/cluster_keys.py (`--only rotation`) and bench/cluster_heal.py: start_cluster runs real daemons
(inferd.daemon.Daemon in subprocesses, sim engines, [cluster] on loopback UDP); each measurement drives
them with a bounded load from its own process, stops them and returns its figures.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
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


def detail(name: str, **fields: object) -> None:
    """One measurement's details, a JSON line on stderr (the summary lines go to stdout)."""
    print(json.dumps({"measurement": name, **fields}), file=sys.stderr, flush=True)
