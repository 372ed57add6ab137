"""Real daemons heal a partition, converge at a cold start, join a seed named by DNS, and show the gossip
series at /metrics.

The partition and cold-start tests run bench/cluster_heal.py (daemon and gossip processes; the partition
inside a private network namespace, `unshare -n`, where `ip rule` can blackhole one UDP port)."""
from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from inferd.config.root import load_config
from tests.daemon.harness import running_daemon, sim_model, until, write_config
from tests.daemon.test_cluster import KEY, cluster_of, cluster_text, peers

HEAL = Path(__file__).resolve().parents[2] / "bench" / "cluster_heal.py"
RECONNECT_INTERVAL_S = 1.0


def namespace_refused() -> str | None:
    """Why a private network namespace with `ip rule` cannot be had here, or None."""
    try:
        probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up && ip rule add pref 100 lookup local"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare -n or ip is not available: {e}"
    return None if probe.returncode == 0 else f"unshare -n / ip rule refused: {probe.stderr.strip()[:200]}"


async def run_bench(*argv: str, timeout_s: float) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return out.decode() + "\n--- stderr ---\n" + err.decode()[-3000:]


@pytest.mark.bench
async def test_a_partition_heals_within_the_reconnect_interval_after_both_sides_reaped_each_other():
    if (why := await asyncio.to_thread(namespace_refused)) is not None:
        pytest.skip(why)
    out = await run_bench("unshare", "-n", sys.executable, str(HEAL), "partition",
                          "--reconnect-interval", str(RECONNECT_INTERVAL_S), "--heal-timeout", "30", timeout_s=240)
    found = re.search(r"^partition healed after: ([0-9.]+) s", out, re.MULTILINE)
    assert found is not None, out
    assert float(found.group(1)) <= RECONNECT_INTERVAL_S + 2.0, out


@pytest.mark.bench
async def test_sixteen_nodes_started_at_once_all_see_all_within_two_seconds_even_at_30_percent_loss():
    out = await run_bench(sys.executable, str(HEAL), "convergence", "--nodes", "16", "--runs", "5",
                          "--cold-drop-rate", "0.3", "--lifetime-s", "120", timeout_s=400)
    found = re.search(r"^convergence N=16 max: ([0-9.]+) s", out, re.MULTILINE)
    assert found is not None, out
    assert float(found.group(1)) <= 2.0, out


def node_config(tmp_path: Path, name: str, seeds: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "cluster.key").write_text(KEY)
    return write_config(d / "inferd.toml", {"sim": sim_model()}, cluster_text(seeds))


async def test_a_daemon_joins_through_a_seed_named_by_dns(tmp_path):
    async with running_daemon(load_config(node_config(tmp_path, "a", ""))) as (a, _, a_url):
        port = a.state.cluster.gossip.address[1]
        path = node_config(tmp_path, "b", f'"localhost:{port}", "no-such-seed.invalid:7946"')
        async with running_daemon(load_config(path)) as (_, _, b_url), aiohttp.ClientSession() as http:
            async def joined() -> bool:
                views = [await peers(http, url) for url in (a_url, b_url)]
                return all([p["state"] for p in view["peers"]] == ["alive"] for view in views)
            await until(joined, "each daemon to see the other alive")


async def test_metrics_show_suspicions_refutations_deaths_the_broadcast_queue_and_push_pulls(tmp_path):
    async with cluster_of(tmp_path, 3) as nodes, aiohttp.ClientSession() as http:
        async def converged() -> bool:
            views = [await peers(http, url) for _, url in nodes]
            return all([p["state"] for p in view["peers"]] == ["alive", "alive"] for view in views)
        await until(converged, "every node to see two alive peers")
        async with http.get(nodes[1][1] + "/metrics") as resp:
            text = await resp.text()
    for series in ("inferd_cluster_suspicions_total", "inferd_cluster_refutations_total",
                   "inferd_cluster_deaths_total", "inferd_cluster_broadcast_queue"):
        assert re.search(rf"^{series} [0-9.]+$", text, re.MULTILINE), series
    for reason in ("join", "periodic", "reconnect", "new_member"):
        assert f'inferd_cluster_push_pulls_total{{reason="{reason}"}}' in text
    joins = re.search(r'^inferd_cluster_push_pulls_total\{reason="join"\} ([0-9.]+)$', text, re.MULTILINE)
    assert joins is not None and float(joins.group(1)) >= 1
