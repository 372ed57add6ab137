"""Partition healing and cold-start convergence of the cluster, measured with real processes.

  partition     Three real daemons (bench/cluster_daemons.py; sim engines, 0.2 s probes) in a private network
                namespace. Node 0's gossip port is cut (UDP to and from it blackholed by `ip rule`; TCP, so
                /admin/peers, still works) until both sides hold each other dead AND the old code's reap time
                (100 probe intervals after the deaths) has passed; then restored. Figure: seconds from the
                restore until every node sees the other two alive. Needs a fresh network namespace, so
                bench/cluster.py runs it as `unshare -n python bench/cluster_heal.py partition ...`.
  convergence   N gossip-only nodes (bench/cluster.py `--role node`: the real Gossip, one process each) launched
                at once, each configured with the same three seeds (the first three nodes' ports, fixed in
                advance, as a fleet's shared seed list), so on this small machine many join before a seed is
                up. Figure: from the moment the last node is up until every node sees all N alive; the
                MAXIMUM over `--runs` cold starts (one slow node is the failure, not the typical run).

    unshare -n .venv/bin/python bench/cluster_heal.py partition [--reconnect-interval 1]
    .venv/bin/python bench/cluster_heal.py convergence [--nodes 16] [--runs 10]

One result line on stdout (`partition healed after: X s`, `convergence N=16 max: X s`); details as JSON on stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster_daemons
from cluster_daemons import detail

from inferd.config import ClusterConfig

OLD_REAP_PROBES = 100          # the old code forgot dead members after this many probe intervals
PROBE_INTERVAL_S = 0.2         # bench/cluster_daemons.py's [cluster] probe_interval_s
HEAL_TIMEOUT_S = 60.0


# -- the network namespace ---------------------------------------------------------------------------
def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


def prepare_namespace() -> None:
    """Loopback up, and the local table looked up after the rules that may blackhole a port (pref 10, 11)."""
    ip("link", "set", "lo", "up")
    rules = subprocess.run(["ip", "rule", "list"], check=True, capture_output=True, text=True).stdout
    if any(line.startswith("0:") for line in rules.splitlines()):
        ip("rule", "add", "pref", "100", "lookup", "local")
        ip("rule", "del", "pref", "0")


def cut(port: int) -> None:
    ip("rule", "add", "pref", "10", "ipproto", "udp", "dport", str(port), "blackhole")
    ip("rule", "add", "pref", "11", "ipproto", "udp", "sport", str(port), "blackhole")


def restore() -> None:
    for pref in ("10", "11"):
        subprocess.run(["ip", "rule", "del", "pref", pref], capture_output=True)


# -- partition --------------------------------------------------------------------------------------------
async def views(http: aiohttp.ClientSession, urls: list[str]) -> list[dict[str, str]]:
    """Per node: member node id -> state, as its /admin/peers says."""
    out = []
    for url in urls:
        async with http.get(url + "/admin/peers") as resp:
            out.append({p["node_id"]: p["state"] for p in (await resp.json())["peers"]})
    return out


async def poll(http: aiohttp.ClientSession, urls: list[str], done, timeout_s: float) -> tuple[bool, list]:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = await views(http, urls)
        if done(seen) or time.monotonic() > deadline:
            return done(seen), seen
        await asyncio.sleep(0.05)


def heal_settings(reconnect_interval_s: float) -> str:
    """[cluster] lines for the settings this code has (the old code refuses unknown ones)."""
    fields = ClusterConfig.__struct_fields__
    lines = "sync_interval_s = 30.0\n"
    if "reconnect_interval_s" in fields:
        lines += f"reconnect_interval_s = {reconnect_interval_s}\n"
    return lines


async def partition_inside(args: argparse.Namespace) -> int:
    prepare_namespace()
    with tempfile.TemporaryDirectory(prefix="inferd-heal-") as tmp:
        nodes = cluster_daemons.start_cluster(Path(tmp), 3, time_scale=0.01, profile="tiny", batch=8,
                                              cluster_extra=heal_settings(args.reconnect_interval))
        try:
            return await _partition(args, nodes)
        finally:
            restore()
            cluster_daemons.stop_cluster(nodes)


async def _partition(args: argparse.Namespace, nodes: list) -> int:
    urls = [f"http://127.0.0.1:{info['port']}" for _, info in nodes]
    ids = [info["node_id"] for _, info in nodes]
    port = int(nodes[0][1]["gossip"].rsplit(":", 1)[1])
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        await cluster_daemons.wait_converged(http, urls, {})
        cut(port)
        cut_at = time.monotonic()

        def split(seen: list[dict[str, str]]) -> bool:      # dead, or already forgotten (the old code's reap)
            return all(seen[0].get(n) in ("dead", None) for n in ids[1:]) and \
                all(seen[i].get(ids[0]) in ("dead", None) for i in (1, 2))

        ok, seen = await poll(http, urls, split, 30.0)
        if not ok:
            raise RuntimeError(f"the cut did not split the cluster: {seen}")
        dead_after = time.monotonic() - cut_at
        await asyncio.sleep(OLD_REAP_PROBES * PROBE_INTERVAL_S + 2.0)
        _, during = await poll(http, urls, lambda seen: True, 0)
        restore()
        restored = time.monotonic()

        def healed(seen: list[dict[str, str]]) -> bool:
            return all(sum(state == "alive" for state in view.values()) == 2 for view in seen)

        ok, seen = await poll(http, urls, healed, args.heal_timeout)
        took = time.monotonic() - restored
    detail("partition", healed=ok, seconds=round(took, 3), dead_after_cut_s=round(dead_after, 3),
           cut_for_s=round(restored - cut_at, 3), views_before_restore=during, views_at_end=seen,
           reconnect_interval_s=args.reconnect_interval)
    if not ok:
        print(f"partition healed after: never (still split {args.heal_timeout:g} s after the restore)", flush=True)
        return 1
    print(f"partition healed after: {took:.2f} s (reconnect_interval_s {args.reconnect_interval:g}; node 0's "
          f"gossip port cut {restored - cut_at:.0f} s, N=3)", flush=True)
    return 0


async def partition(args: argparse.Namespace, workdir: Path) -> list[str]:
    """bench/cluster.py's measurement: this script's `partition` in a fresh network namespace."""
    argv = ["unshare", "-n", sys.executable, str(Path(__file__).resolve()), "partition",
            "--reconnect-interval", str(getattr(args, "reconnect_interval", 1.0))]
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        return [f"partition healed after: not measured (unshare: {e})"]
    out, err = await proc.communicate()
    sys.stderr.write(err.decode())
    lines = [line for line in out.decode().splitlines() if line.startswith("partition healed after")]
    if not lines:       # e.g. not root: unshare -n or ip rule refused; the other measurements still run
        return [f"partition healed after: not measured (exit {proc.returncode}: {err.decode().strip()[-200:]})"]
    return lines


# -- convergence ----------------------------------------------------------------------------------------
def free_udp_ports(n: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


async def cold_start(gossip_bench, group, n: int, seeds_n: int) -> list:
    """n node processes launched at once, every one configured with the same seeds (the first seeds_n
    nodes' addresses, fixed in advance), as a fleet starts: some join before their seeds are up."""
    args = group.args
    ports = free_udp_ports(n)
    seeds = ",".join(f"127.0.0.1:{port}" for port in ports[:seeds_n])
    argv = [sys.executable, gossip_bench.__file__, "--role", "node", "--key", str(args.key),
            "--probe-interval", str(args.probe_interval), "--probe-timeout", str(args.probe_timeout),
            "--gossip-interval", str(args.gossip_interval), "--sync-interval", str(args.sync_interval),
            "--lifetime-s", str(args.lifetime_s), "--seeds", seeds, "--drop-rate", str(args.cold_drop_rate)]
    for port in ports:
        with (group.workdir / f"node-{len(group.nodes)}.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(*argv, "--bind-port", str(port), stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE, stderr=log)
        group.nodes.append(gossip_bench.Node(proc, group.changed))
    await group.wait(lambda: all(node.node_id for node in group.nodes), f"{n} nodes up")
    return group.nodes


async def convergence_max(args: argparse.Namespace, workdir: Path) -> list[str]:
    """N nodes cold-started at once with three shared seeds; the maximum over args.runs starts of the
    time from the last node up until every node sees all N alive."""
    import cluster as gossip_bench  # bench/cluster.py (imported here: it imports this module)

    n, times = args.nodes, []
    for run in range(args.cold_runs):
        async with gossip_bench.Cluster(args, workdir) as group:
            nodes = await cold_start(gossip_bench, group, n, min(3, n))
            last_up = max(node.up_at for node in nodes)
            await group.wait(lambda: gossip_bench.all_see_all(nodes), f"{n} nodes to converge")
            per_node = sorted(max(0.0, node.full_at[n] - last_up) for node in nodes)
            times.append(per_node[-1])
            detail("convergence_max", run=run, nodes=n, seconds=round(per_node[-1], 3),
                   up_spread_s=round(last_up - min(node.up_at for node in nodes), 3),
                   per_node=[round(t, 3) for t in per_node])
    times.sort()
    return [f"convergence N={n} max: {times[-1]:.2f} s (over {len(times)} cold starts, {args.cold_drop_rate:.0%} of "
            f"datagrams dropped; median {times[len(times) // 2]:.2f} s)"]


async def daemon_cold_start(args: argparse.Namespace, workdir: Path) -> float:
    """`args.nodes` real daemons (sim, tiny) launched at once with three shared seeds (ports fixed in
    advance); seconds from the last one ready until every one sees all others alive at /admin/peers."""
    n = args.nodes
    (workdir / "cluster.key").write_text(cluster_daemons.KEY)
    ports = free_udp_ports(n)
    bench = str(Path(__file__).with_name("cluster.py"))
    procs = []
    try:
        for i, port in enumerate(ports):
            seeds = ", ".join(f'"127.0.0.1:{p}"' for p in ports[:3] if p != port)
            path = cluster_daemons._config(workdir, i, seeds, time_scale=0.01, profile="tiny", batch=8,
                                           bind_port=port)
            with (path.parent / "daemon.log").open("w") as log:
                procs.append(subprocess.Popen([sys.executable, bench, "--role", "daemon", "--config", str(path)],
                                              cwd=path.parent, stdout=subprocess.PIPE, stderr=log, text=True))
        infos = await asyncio.gather(*(asyncio.to_thread(proc.stdout.readline) for proc in procs))
        ready = time.monotonic()
        urls = [f"http://127.0.0.1:{json.loads(line)['port']}" for line in infos]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            ok, seen = await poll(http, urls, lambda seen: all(
                sum(state == "alive" for state in view.values()) == n - 1 for view in seen), 120.0)
        took = time.monotonic() - ready
        detail("convergence_daemons", nodes=n, converged=ok, seconds=round(took, 3),
               alive_seen=[sum(state == "alive" for state in view.values()) for view in seen])
        return took if ok else float("inf")
    finally:
        for proc in procs:
            cluster_daemons.stop(proc, timeout=10)


def add_convergence_arguments(p: argparse.ArgumentParser, runs_flag: str) -> None:
    p.add_argument(runs_flag, dest="cold_runs", type=int, default=10, help="convergence: cold starts")
    p.add_argument("--cold-drop-rate", type=float, default=0.0,
                   help="convergence: the fraction of its outgoing datagrams each node drops")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("partition", "convergence"))
    p.add_argument("--reconnect-interval", type=float, default=1.0, help="partition: [cluster] reconnect_interval_s")
    p.add_argument("--heal-timeout", type=float, default=HEAL_TIMEOUT_S, help="partition: give up after this long")
    p.add_argument("--nodes", type=int, default=16, help="convergence: gossip nodes")
    add_convergence_arguments(p, runs_flag="--runs")
    p.add_argument("--probe-interval", type=float, default=0.2)
    p.add_argument("--probe-timeout", type=float, default=0.1)
    p.add_argument("--gossip-interval", type=float, default=0.2)
    p.add_argument("--sync-interval", type=float, default=30.0)
    p.add_argument("--lifetime-s", type=float, default=900.0)
    p.add_argument("--daemons", action="store_true", help="convergence: real daemons instead of gossip nodes")
    args = p.parse_args()
    if args.what == "partition":
        return asyncio.run(partition_inside(args))
    if args.daemons:
        times = []
        for _ in range(args.cold_runs):
            with tempfile.TemporaryDirectory(prefix="inferd-converge-") as tmp:
                times.append(asyncio.run(daemon_cold_start(args, Path(tmp))))
        times.sort()
        print(f"convergence N={args.nodes} max: {times[-1]:.2f} s (over {len(times)} cold starts of real daemons; "
              f"median {times[len(times) // 2]:.2f} s)", flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="inferd-converge-") as tmp:
        args.key = Path(tmp) / "cluster.key"
        args.key.write_text(os.urandom(32).hex() + "\n")
        args.key.chmod(0o600)
        for line in asyncio.run(convergence_max(args, Path(tmp))):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
