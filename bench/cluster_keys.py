"""Key rotation of a live cluster: three daemon processes rotated through install, use, remove.

Used by bench/cluster.py (`--only rotation`). Three real daemons (as bench/cluster_daemons.py starts them,
0.2 s probes), each reading its own key file. Each of the three steps (the new key added as a second
line; moved to the first; the old line removed) is written to one node's file and that node gets a
SIGHUP; `--rotation-stagger` seconds later (default 10 s, many suspicion timeouts) the two others get
theirs, and another stagger passes before the next step; the node that goes first changes each step.
Figure: the deaths any node declared from the first reload to the end (its `cluster_member` log lines
with state dead), which must be 0, with the datagrams dropped as bad_mac beside it. With
`--rotation-baseline`, the same cluster then replaces the key in one step (the new key alone, one node
first): what docs/cluster.md says not to do, to show it splits the cluster.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import cluster_daemons  # noqa: E402 (bench/ is this script's own directory)
from cluster_daemons import detail  # noqa: E402
from daemon_process import spawn

STEPS = ("install", "use", "remove")
_BAD_MAC = re.compile(r'^inferd_cluster_packets_rejected_total\{reason="bad_mac"\} (\S+)$', re.M)


def _keys_file(path: Path, keys: list[str]) -> None:
    path.write_text("# cluster keys, one a line: the first sends, every one is accepted\n" + "\n".join(keys) + "\n")


def _start(workdir: Path, n: int, old: str) -> list[tuple[subprocess.Popen, dict]]:
    """n daemons at info level (their membership changes logged), node i reading node<i>/cluster.key."""
    nodes, seeds = [], ""
    bench = str(Path(__file__).with_name("cluster.py"))
    try:
        for i in range(n):
            path = cluster_daemons._config(workdir, i, seeds)
            key = path.parent / "cluster.key"
            _keys_file(key, [old])
            text = path.read_text().replace(f'key_file = "{workdir / "cluster.key"}"', f'key_file = "{key}"')
            path.write_text(text.replace('log_level = "warning"', 'log_level = "info"'))
            nodes.append(spawn([bench, "--role", "daemon", "--config", str(path)], path.parent, "daemon.log"))
            if i == 0:
                seeds = f'"{nodes[0][1]["gossip"]}"'
    except BaseException:
        cluster_daemons.stop_cluster(nodes)
        raise
    return nodes


def _log_sizes(workdir: Path, n: int) -> list[int]:
    return [(workdir / f"node{i}" / "daemon.log").stat().st_size for i in range(n)]


def _deaths(workdir: Path, since: list[int]) -> list[dict]:
    """Every `cluster_member` line with state dead in the daemons' logs past `since` (byte offsets)."""
    out = []
    for i, offset in enumerate(since):
        with (workdir / f"node{i}" / "daemon.log").open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        for line in text.splitlines():
            if '"cluster_member"' not in line or '"dead"' not in line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("state") == "dead":
                out.append({"observer": i, "member": event.get("node"), "incarnation": event.get("incarnation")})
    return out


async def _bad_macs(http: aiohttp.ClientSession, urls: list[str]) -> int:
    total = 0
    for url in urls:
        async with http.get(url + "/metrics") as resp:
            found = _BAD_MAC.search(await resp.text())
        total += int(float(found.group(1))) if found else 0
    return total


async def _reload(proc: subprocess.Popen, key: Path, keys: list[str]) -> None:
    _keys_file(key, keys)
    proc.send_signal(signal.SIGHUP)
    await asyncio.sleep(0.2)            # the reload reads the file off the loop: let it finish


async def _rotate(workdir: Path, nodes: list, steps: list[list[str]], stagger: float) -> None:
    for step, keys in enumerate(steps):
        first = step % len(nodes)
        await _reload(nodes[first][0], workdir / f"node{first}" / "cluster.key", keys)
        await asyncio.sleep(stagger)
        for i, (proc, _) in enumerate(nodes):
            if i != first:
                await _reload(proc, workdir / f"node{i}" / "cluster.key", keys)
        await asyncio.sleep(stagger)


async def rotation(args: argparse.Namespace, workdir: Path) -> list[str]:
    stagger = getattr(args, "rotation_stagger", 10.0)
    old, new, newer = os.urandom(32).hex(), os.urandom(32).hex(), os.urandom(32).hex()
    rot = workdir / "rotation"
    rot.mkdir(exist_ok=True)
    nodes = _start(rot, 3, old)
    lines = []
    try:
        urls = [f"http://127.0.0.1:{n[1]['port']}" for n in nodes]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await cluster_daemons.wait_converged(http, urls, {})
            since, started = _log_sizes(rot, 3), time.monotonic()
            bad_before = await _bad_macs(http, urls)
            await _rotate(rot, nodes, [[old, new], [new, old], [new]], stagger)
            deaths = _deaths(rot, since)
            bad = await _bad_macs(http, urls) - bad_before
            try:
                await cluster_daemons.wait_converged(http, urls, {}, timeout_s=10)    # still one cluster?
                whole = "one cluster after"
            except RuntimeError:
                whole = "SPLIT 10 s after"
            detail("rotation", steps=list(STEPS), stagger_s=stagger, deaths=deaths, bad_mac=bad,
                   seconds=round(time.monotonic() - started, 1), after=whole)
            lines.append(f"rotation false deaths: {len(deaths)} (3 nodes, install/use/remove, one node "
                         f"{stagger:g} s ahead each step; datagrams dropped as bad_mac: {bad}; {whole})")
            if getattr(args, "rotation_baseline", False):
                since = _log_sizes(rot, 3)
                await _rotate(rot, nodes, [[newer]], stagger)
                split = _deaths(rot, since)
                detail("rotation_one_step", stagger_s=stagger, deaths=split)
                lines.append(f"rotation false deaths, one-step replacement (baseline): {len(split)}")
    finally:
        cluster_daemons.stop_cluster(nodes)
    return lines
