"""Spillover measured as a user sees it: streamed requests, time to the first content chunk (TTFT).

Used by bench/cluster.py (`--only spillover`) and tests/daemon/test_cluster_spill.py. Three real
daemons (bench/cluster_daemons.py: sim engines with H100 Llama 3 8B timing, 8 sequence slots each,
[cluster] on loopback) with a TTFT SLO of TTFT_SLO_MS on the model; every request goes to node 0.

- Capacity: node 0 alone (spillover off), closed loop, completions per second.
- Open loop: Poisson arrivals at each multiple of that capacity (2x and 3.5x), streamed, each with a
  deadline of DEADLINE_S (X-Request-Timeout), with spillover off and then on (a fresh cluster each way).
- TTFT goodput: requests whose first content chunk reached the client within the TTFT SLO, per second
  of arrivals. The ratio is on / off.
- Refusals while a peer had room: node 0 refused (429/503/504, or a stream that ended in an error
  frame before any content) while the peers, by this client's count, had more free slots than there
  were requests still on their way. A stream holds a slot of the node X-Inferd-Node names from its
  response's headers (the node admitted it; a stream queued over 1 s gets them early) to its end.
- The older figure, kept: at 2x with a deadline of `slo_s` (5 s), requests answered whole (the stream's
  [DONE]) within it, per second, on / off ("spillover goodput ratio").
"""
from __future__ import annotations

import asyncio
import random
import re
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from cluster_daemons import start_cluster, stop_cluster, wait_converged  # noqa: E402 (bench/ is on sys.path)

SLOTS = 8                        # each daemon's max_batch_size (cluster_daemons' default)
TTFT_SLO_MS = 500
SLO = f'[slos.first_token]\nmodel = "m"\nsli = "ttft"\nthreshold_ms = {TTFT_SLO_MS}\nobjective = 0.99\n'
REQUEST = {"model": "m", "prompt": "Summarise the plot of a long novel in a few sentences.", "max_tokens": 128,
           "temperature": 0, "ignore_eos": True}
# Requests' deadline (X-Request-Timeout) in the TTFT runs: tight enough that the origin's early refusal
# (estimated wait past half the time left) comes into play at the loads measured, as for interactive
# requests; 128 tokens take about 1 s to generate.
DEADLINE_S = 1.5
OLDER = "2x, whole answers"     # the run of the older figure (spillover goodput ratio)
SPILLOVERS = re.compile(r'inferd_cluster_spillovers_total\{outcome="(\w+)"\} ([0-9.]+)')


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


class _Running:
    """Streams on each node as this client counts them: from the response's headers (the node has
    admitted it) to its end; and the requests sent that have no answer yet (they may be on their way
    to any node)."""

    def __init__(self, peers: list[str]) -> None:
        self.peers = peers
        self.by_node: dict[str, int] = {}
        self.pending = 0

    def peer_room(self) -> int:
        """Free slots on the peers together that no request still on its way could be taking."""
        return sum(max(0, SLOTS - self.by_node.get(p, 0)) for p in self.peers) - self.pending


async def _stream(http: aiohttp.ClientSession, url: str, headers: dict, running: _Running) -> dict:
    """One streamed request: status, node, TTFT (None: no content), whole time, and how it ended."""
    t0 = time.monotonic()
    r = {"status": 0, "node": "?", "ttft": None, "took": None, "done": False, "error": False, "room": 0}
    counted = None
    running.pending += 1
    try:
        async with http.post(url, json={**REQUEST, "stream": True}, headers=headers) as resp:
            running.pending -= 1
            r["status"], r["node"] = resp.status, resp.headers.get("X-Inferd-Node", "?")
            if resp.status != 200:
                r["room"] = running.peer_room()
                await resp.read()
                return r
            counted = r["node"]
            running.by_node[counted] = running.by_node.get(counted, 0) + 1
            async for line in resp.content:
                if r["ttft"] is None and line.startswith(b"data: {"):
                    event = orjson.loads(line[6:])
                    if "error" in event:
                        r["error"] = True
                    elif any(c.get("text") for c in event.get("choices", ())):
                        r["ttft"] = time.monotonic() - t0
                elif line.startswith(b"data: [DONE]"):
                    r["done"] = True
                elif line.startswith(b"data: {") and b'"error"' in line:
                    r["error"] = True
            if r["error"] and r["ttft"] is None:
                r["room"] = running.peer_room()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        if r["status"] == 0:
            running.pending -= 1
        r["error"] = True
    finally:
        if counted is not None:
            running.by_node[counted] -= 1
        r["took"] = time.monotonic() - t0
    return r


async def _open_loop(http: aiohttp.ClientSession, url: str, node0: str, peers: list[str], rate: float,
                     seconds: float, slo_s: float, seed: int) -> dict:
    """Poisson arrivals of streamed requests at `rate`/s for `seconds`, each with a deadline of `slo_s`."""
    rng = random.Random(seed)
    running = _Running(peers)
    headers = {"X-Request-Timeout": str(slo_s)}
    tasks, t, start = [], 0.0, time.monotonic()
    while t < seconds:
        t += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, start + t - time.monotonic()))
        tasks.append(asyncio.ensure_future(_stream(http, url, headers, running)))
    results = await asyncio.wait_for(asyncio.gather(*tasks), slo_s + 30)
    slo = TTFT_SLO_MS / 1000
    refused = [r for r in results if r["node"] in (node0, "?")
               and (r["status"] in (429, 503, 504) or (r["status"] == 200 and r["error"] and r["ttft"] is None))]
    by_node: dict[str, list[float]] = {}
    for r in results:
        if r["ttft"] is not None:
            by_node.setdefault(r["node"], []).append(r["ttft"])
    good = sum(1 for r in results if r["ttft"] is not None and r["ttft"] <= slo)
    return {"sent": len(results), "offered_per_s": rate, "ttft_goodput_per_s": good / seconds,
            "ttft_good_fraction": good / max(1, len(results)),
            "goodput_per_s": sum(1 for r in results if r["done"] and r["took"] <= slo_s) / seconds,
            "refused": len(refused), "refused_while_peer_had_room": sum(1 for r in refused if r["room"] > 0),
            "refused_while_peer_had_room_by_status": _by_status([r for r in refused if r["room"] > 0]),
            "statuses": _by_status(results),
            "ttft_p50_s_by_node": {("origin" if n == node0 else n): round(statistics.median(v), 3)
                                   for n, v in by_node.items()},
            "ttft_missed_by_node": {("origin" if n == node0 else n): sum(1 for x in v if x > slo)
                                    for n, v in by_node.items()},
            "served_by": {("origin" if n == node0 else n): len(v) for n, v in by_node.items()}}


def _by_status(results: list[dict]) -> dict[str, int]:
    """How many ended each way: the HTTP status, "+error" for a stream that ended in an error frame."""
    out: dict[str, int] = {}
    for r in results:
        key = str(r["status"]) + ("+error" if r["status"] == 200 and r["error"] else "")
        out[key] = out.get(key, 0) + 1
    return out


async def _spillovers(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    return {outcome: int(float(n)) for outcome, n in SPILLOVERS.findall(text)}


async def spillover_ttft(seconds: float = 30.0, capacity_seconds: float = 8.0, slo_s: float | None = 5.0,
                         loads: tuple[float, ...] = (2.0, 3.5), deadline_s: float = DEADLINE_S) -> dict:
    """Each load (a multiple of node 0's capacity) off, then on, with requests' deadline `deadline_s`;
    and, for the older whole-answer figure, 2x with deadline `slo_s` (None: not run). See the docstring."""
    out: dict = {"ttft_slo_ms": TTFT_SLO_MS, "deadline_s": deadline_s, "slo_s": slo_s, "runs": {}}
    plan = [(f"{load:g}x", load, deadline_s) for load in loads]
    if slo_s is not None:
        plan.append((OLDER, 2.0, slo_s))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120),
                                     connector=aiohttp.TCPConnector(limit=0)) as http:
        for spillover in (False, True):
            with tempfile.TemporaryDirectory(prefix="inferd-spill-") as tmp:
                nodes = start_cluster(Path(tmp), 3, spillover=spillover, spill_wait=1.0, auth=SLO)
                try:
                    urls = [f"http://127.0.0.1:{n[1]['port']}" for n in nodes]
                    ids = [n[1]["node_id"] for n in nodes]
                    await wait_converged(http, urls, {})
                    url = urls[0] + "/v1/completions"
                    if "capacity_per_s" not in out:
                        out["capacity_per_s"] = await _closed_loop(http, url, 16, capacity_seconds)
                    for i, (name, load, deadline) in enumerate(plan):
                        run = await _open_loop(http, url, ids[0], ids[1:], load * out["capacity_per_s"], seconds,
                                               deadline, seed=7 + i)
                        out["runs"].setdefault(name, {})["on" if spillover else "off"] = run
                    if spillover:
                        out["spillovers"] = await _spillovers(http, urls[0])
                finally:
                    stop_cluster(nodes)
                    for proc, _ in nodes:
                        proc.stdout.close()
    for run in out["runs"].values():
        run["ratio"] = run["on"]["ttft_goodput_per_s"] / max(1e-9, run["off"]["ttft_goodput_per_s"])
        run["completed_ratio"] = run["on"]["goodput_per_s"] / max(1e-9, run["off"]["goodput_per_s"])
    return out


def lines(out: dict) -> list[str]:
    """bench/cluster.py's result lines."""
    result = []
    runs = dict(out["runs"])
    older = runs.pop(OLDER, None)
    cap = out["capacity_per_s"]
    if older is not None:
        on, off = older["on"], older["off"]
        result.append(f"spillover goodput ratio: {older['completed_ratio']:.2f} (on {on['goodput_per_s']:.2f}/s"
                      f" vs off {off['goodput_per_s']:.2f}/s; node 0 capacity {cap:.2f}/s, offered "
                      f"{on['offered_per_s']:.2f}/s, SLO {out['slo_s']:g} s)")
    for name, run in runs.items():
        on, off = run["on"], run["off"]
        result.append(f"spillover TTFT goodput ratio at {name}: {run['ratio']:.2f} (on "
                      f"{on['ttft_goodput_per_s']:.2f}/s vs off {off['ttft_goodput_per_s']:.2f}/s within "
                      f"{out['ttft_slo_ms']} ms; offered {on['offered_per_s']:.2f}/s, streamed, deadline "
                      f"{out['deadline_s']:g} s)")
    for name, run in runs.items():
        result.append(f"refusals while a peer had room at {name}: {run['on']['refused_while_peer_had_room']} "
                      f"(origin refused {run['on']['refused']} in all)")
    return result
