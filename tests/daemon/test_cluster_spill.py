"""Spillover with real daemons: slots reserved on peers between their load hints, a spill decided from
the request's TTFT budget, and (bench) TTFT goodput with no refusals while a peer has room.

The fast tests run daemons in process (the tiny sim profile in real time, about 2.5 ms a token); the
bench one starts daemon processes as bench/cluster.py does (bench/cluster_spill.py)."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.daemon.harness import cluster_daemons, until

KEY = "cd" * 32
CLUSTER = """
[cluster]
bind_port = 0
key_file = "cluster.key"
seeds = [{seeds}]
probe_interval_s = 0.05
probe_timeout_s = 0.02
gossip_interval_s = 0.02
load_interval_s = {load_interval}
load_max_age_s = 3.0
spill_wait_s = {spill_wait}
"""


def long_request(tokens: int) -> dict:
    return {"model": "sim", "prompt": "hello there", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}


@contextlib.asynccontextmanager
async def spill_cluster(tmp_path: Path, n: int, *, slots: int, load_interval: float = 0.05,
                        spill_wait: float = 0.01, extra: str = ""):
    """n in-process daemons of `slots` sequence slots each; the first is every other's seed; `extra`:
    more config for node 0 (e.g. [slos.*]). Yields [(daemon, base_url)]."""
    def node_config(i: int, seeds: str) -> str:
        text = CLUSTER.format(seeds=seeds, load_interval=load_interval, spill_wait=spill_wait)
        return text + (extra if i == 0 else "")

    async with cluster_daemons(tmp_path, n, node_config, key=KEY, slots=slots) as nodes:
        yield nodes


def _version(daemon) -> str:
    return daemon.state.engines["sim"].info.version


async def _hint_of(a, b, free: int) -> bool:
    """Node 0's latest hint of node 1 says `free` slots and no wait."""
    cluster = a.state.cluster
    hints = [h for h, age in cluster.loads.versions(b.state.cluster.node_id) if age <= cluster.loads.max_age_s]
    return any(h.free_slots == free and h.est_wait_s == 0 for h in hints)


async def _free_slots(daemon, n: int) -> bool:
    return daemon.state.engines["sim"].capacity().free_slots == n


async def test_a_burst_larger_than_one_peers_free_slots_is_spread_over_the_peers(tmp_path):
    """Hints every 2 s: the whole burst falls between two of them. Node 0 is busy; each peer has two slots
    free; four requests at once go two to each peer (before, all four went to the same peer: the one
    whose hint looked best, where two then waited for the first two)."""
    async with spill_cluster(tmp_path, 3, slots=2, load_interval=2.0) as nodes, aiohttp.ClientSession() as http:
        (a, a_url), (b, _), (c, _) = nodes
        for peer in (b, c):
            await until(lambda peer=peer: _hint_of(a, peer, 2), "node 0 to hear each peer has two slots free",
                        timeout_s=10)
        busy = [asyncio.ensure_future(http.post(a_url + "/v1/completions", json=long_request(1500)))
                for _ in range(2)]
        await until(lambda: _free_slots(a, 0), "node 0's two slots to be taken")

        async def one() -> tuple[int, str]:
            async with http.post(a_url + "/v1/completions", json=long_request(200)) as resp:
                await resp.read()
                return resp.status, resp.headers["X-Inferd-Node"]

        served = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(4))), 30)
        for task in busy:
            task.cancel()
        assert collections.Counter(served) == {(200, b.state.cluster.node_id): 2, (200, c.state.cluster.node_id): 2}
        assert a.state.cluster.spillovers == {"forwarded": 4}
        assert a.state.cluster.reservations.in_flight() == 0        # every forward ended: none held


@contextlib.asynccontextmanager
async def one_running_one_queued(a, a_url: str, b, http: aiohttp.ClientSession):
    """Once node 0 has heard node 1 has room: node 0's only slot runs a long request and its queue holds
    another of about 1 s of work (entered while the wait was ~0.04 s, within any budget here)."""
    queue = a.state.tenancy.queue_for("sim", a.state.engines["sim"])
    await until(lambda: _hint_of(a, b, 1), "node 0 to hear node 1 has room")
    running = asyncio.ensure_future(http.post(a_url + "/v1/completions", json=long_request(1500)))
    await until(lambda: _free_slots(a, 0), "node 0's slot to be taken")

    async def rate_known() -> bool:
        return queue.load().wait_s < 0.1        # a service rate is known: one request's worth (~0.04 s)
    await until(rate_known, "node 0 to know its service rate")
    queued = asyncio.ensure_future(http.post(a_url + "/v1/completions", json=long_request(400)))

    async def one_queued() -> bool:
        return sum(queue.load().queued) == 1
    await until(one_queued, "the second request to wait in node 0's queue")
    try:
        yield queue
    finally:
        running.cancel()
        queued.cancel()


async def test_a_request_spills_once_its_local_wait_exceeds_its_ttft_slo_even_below_spill_wait_s(tmp_path):
    """spill_wait_s = 30 s, and a 300 ms TTFT SLO on the model. The next request's local wait (~1 s) is
    far below spill_wait_s but past its TTFT budget, so it goes to the idle peer (before, it waited here)."""
    slo = '[slos.fast_first_token]\nmodel = "sim"\nsli = "ttft"\nthreshold_ms = 300\nobjective = 0.99\n'
    async with spill_cluster(tmp_path, 2, slots=1, spill_wait=30.0, extra=slo) as nodes, \
            aiohttp.ClientSession() as http:
        (a, a_url), (b, _) = nodes
        async with one_running_one_queued(a, a_url, b, http) as queue:
            assert 0.3 < queue.load().wait_s < 30.0
            async with http.post(a_url + "/v1/completions", json=long_request(4)) as resp:
                assert resp.status == 200
                assert resp.headers["X-Inferd-Node"] == b.state.cluster.node_id
        assert a.state.cluster.spillovers == {"forwarded": 1}


async def test_a_request_the_local_queue_would_refuse_for_its_deadline_goes_to_a_peer_with_room(tmp_path):
    """No TTFT SLO, spill_wait_s = 30 s. A request with a 1 s deadline would be refused here at once
    (early refusal: its ~1 s wait is past half the time left), so it goes to the idle peer instead
    (before, node 0 refused it: it spilled only past spill_wait_s)."""
    async with spill_cluster(tmp_path, 2, slots=1, spill_wait=30.0) as nodes, aiohttp.ClientSession() as http:
        (a, a_url), (b, _) = nodes
        async with one_running_one_queued(a, a_url, b, http) as queue:
            assert 0.5 < queue.load().wait_s < 30.0
            async with http.post(a_url + "/v1/completions", json=long_request(4),
                                 headers={"X-Request-Timeout": "1"}) as resp:
                assert resp.status == 200
                assert resp.headers["X-Inferd-Node"] == b.state.cluster.node_id
        assert a.state.cluster.spillovers == {"forwarded": 1}


async def test_an_idle_node_keeps_a_request_whose_ttft_budget_was_spent_before_admission(tmp_path):
    """A 50 ms TTFT SLO, and a body that takes 0.3 s to upload: the budget is spent before admission, but
    node 0's queue is idle, so the request starts here at once (before, a spent budget sent it to the
    peer: a hop and a second tokenization for nothing)."""
    slo = '[slos.fast]\nmodel = "sim"\nsli = "ttft"\nthreshold_ms = 50\nobjective = 0.99\n'
    body = json.dumps(long_request(4)).encode()

    async def slow_upload():
        yield body[:10]
        await asyncio.sleep(0.3)
        yield body[10:]

    async with spill_cluster(tmp_path, 2, slots=1, extra=slo) as nodes, aiohttp.ClientSession() as http:
        (a, a_url), (b, _) = nodes
        await until(lambda: _hint_of(a, b, 1), "node 0 to hear node 1 has room")
        async with http.post(a_url + "/v1/completions", data=slow_upload(),
                             headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 200
            assert resp.headers["X-Inferd-Node"] == a.state.cluster.node_id
        assert a.state.cluster.spillovers == {}


@pytest.mark.bench
async def test_spillover_ttft_goodput_at_twice_capacity_beats_no_spill_with_no_refusals_while_a_peer_has_room(
        tmp_path):
    """Three daemon processes (bench/cluster_spill.py): streamed requests to node 0 at 2x its measured
    capacity, a 1.5 s deadline, a 500 ms TTFT SLO. Goodput (first content chunk within the SLO, per
    second) with spillover is at least 1.3x the same run without it, node 0 refuses nothing while a peer
    has a free slot, and nearly every request meets the SLO (the peers have room for all of them).
    Before, node 0 refused ~90 of 250 while its peers idled: its early refusal (wait past half the
    deadline, 0.75 s) came before its spill (wait past spill_wait_s, 1 s)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import cluster_spill

    out = await cluster_spill.spillover_ttft(seconds=15.0, capacity_seconds=6.0, slo_s=None, loads=(2.0,))
    run = out["runs"]["2x"]
    assert run["ratio"] >= 1.3, run
    assert run["on"]["refused_while_peer_had_room"] == 0, run
    assert run["on"]["ttft_good_fraction"] >= 0.8, run
