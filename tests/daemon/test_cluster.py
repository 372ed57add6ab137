"""Three real daemons on loopback form a cluster: membership, /admin/peers, spillover, forged identity.

Each daemon serves the tiny sim profile in real time (about 2.5 ms a token) with one sequence slot, so
one long request keeps a node busy; gossip runs at 50 ms probe intervals (500 ms in the spillover tests, whose
peers must not turn suspect when a loaded machine stalls the loop they all share)."""
from __future__ import annotations

import asyncio
import logging
import contextlib
import hashlib
import time
from pathlib import Path

import aiohttp
import msgspec
import pytest
from openai import AsyncOpenAI

from inferd.cluster.identity import ForwardedIdentity, sign_identity
from inferd.cluster.wire import Keyring
from inferd.config.root import load_config
from tests.daemon.harness import cluster_daemons, running_daemon, sim_model, until, write_config

KEY = "ab" * 32
CLUSTER = """
[cluster]
bind_port = 0
key_file = "cluster.key"
seeds = [{seeds}]
probe_interval_s = {probe_interval_s}
probe_timeout_s = {probe_timeout_s}
gossip_interval_s = 0.02
load_interval_s = 0.05
load_max_age_s = 1.0
spill_wait_s = 0.01
"""


def cluster_text(seeds: str, probe_s: tuple[float, float] = (0.05, 0.02)) -> str:
    """The [cluster] table: `seeds`, and the failure detector's probe interval and timeout."""
    return CLUSTER.format(seeds=seeds, probe_interval_s=probe_s[0], probe_timeout_s=probe_s[1])


SHORT = {"model": "sim", "prompt": "hello there", "max_tokens": 4, "temperature": 0}
LONG = {"model": "sim", "prompt": "hello there", "max_tokens": 1500, "temperature": 0, "ignore_eos": True}


@contextlib.asynccontextmanager
async def cluster_of(tmp_path: Path, n: int, *, extra: dict[int, str] | None = None,
                     probe_s: tuple[float, float] = (0.05, 0.02)):
    """n daemons; the first is every other's seed; `extra[i]`: more [cluster] lines for node i; `probe_s`: the
    failure detector's probe interval and timeout. Yields [(daemon, base_url)]."""
    (tmp_path / "cluster.key").write_text(KEY)

    def config(i: int, seeds: str) -> str:
        return cluster_text(seeds, probe_s) + (extra or {}).get(i, "")
    async with cluster_daemons(tmp_path, n, config, key=KEY) as nodes:
        yield nodes


@contextlib.asynccontextmanager
async def busy_first_node(tmp_path: Path, extra: dict[int, str] | None = None):
    """Two daemons; once node 0 has heard node 1 has room, a long request takes node 0's only slot.
    Yields (node 0, its URL, node 1, a client session, the long request's task). Spillover, not failure
    detection, is under test: probes are slow enough that a loaded machine's stalled loop (all the daemons
    share the test's) does not make node 1 suspect between a check that it has room and the next request."""
    async with cluster_of(tmp_path, 2, extra=extra, probe_s=(0.5, 0.4)) as nodes, aiohttp.ClientSession() as http:
        (a, a_url), (b, _) = nodes
        await until(lambda: _has_room(a, b), "node 0 to hear node 1 has room")
        busy = asyncio.ensure_future(http.post(a_url + "/v1/completions", json=LONG))
        await until(lambda: _busy(a), "node 0's only slot to be taken")
        try:
            yield a, a_url, b, http, busy
        finally:
            busy.cancel()


async def peers(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url + "/admin/peers") as resp:
        assert resp.status == 200
        return await resp.json()


async def test_three_daemons_see_each_other_alive_with_load_hints_at_admin_peers(tmp_path):
    async with cluster_of(tmp_path, 3) as nodes, aiohttp.ClientSession() as http:
        async def converged() -> bool:
            for _, url in nodes:
                view = await peers(http, url)
                if [p["state"] for p in view["peers"]] != ["alive", "alive"]:
                    return False
                if not all("sim" in p["models"] for p in view["peers"]):
                    return False
            return True
        await until(converged, "every node to see two alive peers with their models")
        view = await peers(http, nodes[0][1])
        assert view["self"] == nodes[0][0].state.cluster.node_id
        hint = next(iter(view["peers"][0]["models"]["sim"].values()))
        assert hint["ready"] is True and hint["free_slots"] == 1 and not hint["stale"]
        async with http.get(nodes[0][1] + "/metrics") as resp:
            text = await resp.text()
        assert 'inferd_cluster_members{state="alive"} 3.0' in text


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_a_busy_node_spills_to_a_peer_and_the_response_names_the_node_that_served_it(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    since = time.monotonic()                   # before busy_first_node's LONG request began
    async with busy_first_node(tmp_path) as (a, a_url, b, http, busy):
        holds = [(busy, since)]
        await _keep_busy(a, a_url, b, http, holds)
        async with http.post(a_url + "/v1/completions", json=SHORT, headers={"traceparent": TRACEPARENT}) as resp:
            assert resp.status == 200
            assert resp.headers["X-Inferd-Node"] == b.state.cluster.node_id
            assert (await resp.json())["usage"]["completion_tokens"] == 4
        await _keep_busy(a, a_url, b, http, holds)
        async with AsyncOpenAI(base_url=a_url + "/v1", api_key="unused", max_retries=0) as sdk:
            raw = await sdk.completions.with_raw_response.create(**SHORT, stream=True,
                                                                stream_options={"include_usage": True})
            assert raw.headers["X-Inferd-Node"] == b.state.cluster.node_id
            chunks = [c async for c in raw.parse()]
        assert chunks[-1].usage.completion_tokens == 4
        await _keep_busy(a, a_url, b, http, holds)
        async with http.post(a_url + "/v1/completions", json={**SHORT, "n": 2}) as resp:   # forwarded as sent:
            assert resp.headers["X-Inferd-Node"] == b.state.cluster.node_id            # the peer applies n
            body = await resp.json()
            assert [c["index"] for c in body["choices"]] == [0, 1] and body["usage"]["completion_tokens"] == 8
        assert a.state.cluster.spillovers["forwarded"] == 3
        for task, _ in holds:
            task.cancel()
    # the caller's trace context went on to the peer (neither node traces): both request lines carry it
    assert len([r for r in caplog.records if getattr(r, "fields", {}).get("traceparent") == TRACEPARENT]) == 2


# The sim runs in real time (the tiny profile: 2.5 ms a step at least), so a LONG request cannot end
# sooner than 3.75 s after it was sent; one sent under RENEW_HOLD_AFTER_S ago has over a second left.
RENEW_HOLD_AFTER_S = 2.0


async def _keep_busy(a, a_url: str, b, http: aiohttp.ClientSession, holds: list) -> None:
    """Before each request that must spill: node 1 known to have room, and node 0's only slot held by a
    LONG request young enough that it cannot end before the next request is decided, however slow the
    machine (an older one is let go and a new one sent). `holds`: [(request task, when it was sent)]."""
    while True:
        task, since = holds[-1]
        if time.monotonic() - since > RENEW_HOLD_AFTER_S:
            task.cancel()                      # its client leaving aborts it within a step
            await until(lambda: _free(a), "node 0's slot to come free")
            holds.append((asyncio.ensure_future(http.post(a_url + "/v1/completions", json=LONG)), time.monotonic()))
            await until(lambda: _busy(a), "node 0's only slot to be taken again")
        await until(lambda: _has_room(a, b), "node 0 to hear node 1 has room")
        if time.monotonic() - holds[-1][1] <= RENEW_HOLD_AFTER_S:
            return


async def _free(a) -> bool:
    return a.state.engines["sim"].capacity().free_slots == 1


async def _has_room(a, b) -> bool:
    # A wait of 0, the strictest a request can ask: one that took over half its budget (spill_wait_s here)
    # to reach the decision, as on a loaded machine, spills only to a peer whose hint says it starts now.
    # A hint measured while node 1 was still ending the previous spill shows a slot (its end counted
    # against the reservation) but a wait above 0.
    return a.state.cluster.peer_with_room("sim", b.state.engines["sim"].info.version, within_s=0.0) is not None


async def _busy(a) -> bool:
    return a.state.engines["sim"].capacity().free_slots == 0


async def test_a_forwarded_request_signed_with_another_key_or_for_another_body_is_refused(tmp_path):
    async with cluster_of(tmp_path, 1) as nodes, aiohttp.ClientSession() as http:
        (daemon, url), = nodes
        body = b'{"model": "sim", "prompt": "hi", "max_tokens": 2}'

        def token(key: bytes, signed_body: bytes) -> str:
            return sign_identity(Keyring(key), ForwardedIdentity(
                tenant="local", key_id=None, origin="x", destination=daemon.state.cluster.node_id, request_id="r1",
                body_sha256=hashlib.sha256(signed_body).digest(), expires=time.time() + 30))

        for bad in (token(b"k" * 32, body), token(bytes.fromhex(KEY), b"{}")):
            async with http.post(url + "/v1/completions", data=body, headers={
                    "Content-Type": "application/json", "X-Inferd-Forwarded": bad}) as resp:
                assert resp.status == 401
                assert (await resp.json())["error"]["code"] == "invalid_forwarded_identity"
        good = token(bytes.fromhex(KEY), body)
        async with http.post(url + "/v1/completions", data=body, headers={
                "Content-Type": "application/json", "X-Inferd-Forwarded": good}) as resp:
            assert resp.status == 200          # the right key, for this body: served, not charged here
        async with http.post(url + "/v1/completions", data=body, headers={
                "Content-Type": "application/json", "X-Inferd-Forwarded": good}) as resp:
            assert resp.status == 401          # a copy of a used token: one request per token


async def test_a_draining_daemon_announces_it_is_leaving_and_peers_stop_counting_it(tmp_path):
    async with cluster_of(tmp_path, 2) as nodes, aiohttp.ClientSession() as http:
        (a, a_url), (b, _) = nodes
        await until(lambda: _has_room(a, b), "node 0 to hear node 1")
        b.request_stop()                       # SIGTERM: leave the cluster, then drain

        async def b_left() -> bool:
            view = await peers(http, a_url)
            return [p["state"] for p in view["peers"]] == ["left"]
        await until(b_left, "node 0 to see node 1 as left (not dead: it said so)", timeout_s=3.0)
        assert a.state.cluster.peer_with_room("sim", a.state.engines["sim"].info.version) is None


async def test_reload_applies_cluster_settings_and_refuses_an_unreadable_key_file(tmp_path):
    async with cluster_of(tmp_path, 1) as nodes:
        (daemon, _), = nodes
        path = tmp_path / "node0" / "inferd.toml"
        text = path.read_text()
        path.write_text(text.replace("spill_wait_s = 0.01", "spill_wait_s = 2.5"))
        result = await daemon.reload(path)
        assert result.ok and daemon.state.cluster.config.spill_wait_s == 2.5
        path.write_text(text.replace('key_file = "cluster.key"', 'key_file = "missing.key"'))
        result = await daemon.reload(path)
        assert not result.ok and "missing.key" in result.errors[0]
        assert daemon.state.cluster.config.spill_wait_s == 2.5        # nothing of the refused file applied


async def test_a_peer_that_cannot_be_reached_before_its_first_byte_leaves_the_request_to_run_here(tmp_path):
    unreachable = 'http_url = "http://127.0.0.1:9"\n'        # discard port: nothing listens
    async with busy_first_node(tmp_path, extra={1: unreachable}) as (a, a_url, _, http, busy):
        started = asyncio.ensure_future(http.post(a_url + "/v1/completions", json=SHORT))
        await until(lambda: _spilled(a, "ran_locally"), "node 0 to give up on node 1")
        busy.cancel()                          # frees node 0's slot for the request left to run here
        async with await started as resp:
            assert resp.status == 200 and resp.headers["X-Inferd-Node"] == a.state.cluster.node_id
        assert a.state.cluster.spillovers == {"peer_failed": 1, "ran_locally": 1}


async def test_a_peer_that_did_not_answer_is_not_tried_again_before_its_next_hint(tmp_path):
    """Node 1's hint says it has room but its API does not answer: after one failed try, the next request
    does not wait on it again until a hint measured after the failure (node 1 now reports every 5 s)."""
    unreachable = 'http_url = "http://127.0.0.1:9"\n'        # discard port: nothing listens
    async with busy_first_node(tmp_path, extra={1: unreachable}) as (a, a_url, b, http, busy):
        for node, changes in ((a, {"load_max_age_s": 30.0}), (b, {"load_interval_s": 5.0, "load_max_age_s": 30.0})):
            config = msgspec.structs.replace(node.state.cluster.config, **changes)
            node.state.cluster.reconfigure(config, await node.state.cluster.read_key(config))

        async def reports_slowly() -> bool:     # node 1's last 0.05 s report is behind it: the next in 5 s
            age = a.state.cluster.loads.report_age(b.state.cluster.node_id)
            return age is not None and age > 0.3
        await until(reports_slowly, "node 1 to report every 5 s")
        first = asyncio.ensure_future(http.post(a_url + "/v1/completions", json=SHORT))
        await until(lambda: _spilled(a, "ran_locally"), "node 0 to give up on node 1")
        second = asyncio.ensure_future(http.post(a_url + "/v1/completions", json=SHORT))
        await until(lambda: _spilled(a, "no_peer"), "node 0 to find no peer for the second request")
        busy.cancel()
        for started in (first, second):
            async with await started as resp:
                assert resp.status == 200
        assert a.state.cluster.spillovers["peer_failed"] == 1


async def _spilled(a, outcome: str) -> bool:
    return a.state.cluster.spillovers.get(outcome, 0) > 0


async def test_a_client_leaving_a_spilled_stream_aborts_it_on_the_peer(tmp_path):
    async with busy_first_node(tmp_path) as (a, a_url, b, http, _):
        async with http.post(a_url + "/v1/completions", json={**LONG, "stream": True}) as resp:
            assert resp.headers["X-Inferd-Node"] == b.state.cluster.node_id
            await resp.content.readline()      # the stream is flowing on node 1
            assert b.state.engines["sim"].capacity().free_slots == 0
        await until(lambda: _idle(b), "node 1 to abort the stream its client left")


async def _idle(b) -> bool:
    return b.state.engines["sim"].capacity().free_slots == 1


async def test_a_daily_token_budget_holds_on_the_clusters_sum_even_after_a_node_is_gone(tmp_path):
    """Each node keeps its own ledger (SQLite in its own state directory); the budget is 40 tokens a
    day for the whole cluster, so node 1 refuses before its own rows reach 40, and goes on refusing
    once node 0, which spent the rest, has stopped."""
    budget = '[tenants.local]\nmax_tokens_per_day = 40\n'
    async with cluster_of(tmp_path, 2, extra={0: budget, 1: budget}) as nodes, aiohttp.ClientSession() as http:
        (a, a_url), (b, b_url) = nodes

        async def send(url: str) -> tuple[int, dict]:
            async with http.post(url + "/v1/completions", json=SHORT) as resp:
                return resp.status, await resp.json()

        spent_on_a = 0
        for _ in range(3):
            status, body = await send(a_url)
            assert status == 200
            spent_on_a += body["usage"]["total_tokens"]
        assert 0 < spent_on_a < 40

        async def b_has_heard() -> bool:
            return b.state.tenancy.budgets.totals("local")[1] >= spent_on_a
        await until(b_has_heard, "node 1 to hear node 0's spend")
        statuses = []
        while not statuses or statuses[-1] == 200:
            assert len(statuses) < 10, statuses
            status, body = await send(b_url)
            statuses.append(status)
        own_on_b = b.state.tenancy.budgets.own("local")[1]
        assert statuses[-1] == 429 and body["error"]["code"] == "budget_exceeded"
        assert "40 tokens for today" in body["error"]["message"]
        assert own_on_b < 40 <= spent_on_a + own_on_b       # refused on the cluster's sum, not its own rows

        async def a_has_heard() -> bool:
            return a.state.tenancy.budgets.totals("local")[1] >= 40
        await until(a_has_heard, "node 0 to hear node 1's spend")
        status, body = await send(a_url)
        assert status == 429 and body["error"]["code"] == "budget_exceeded"

        a.request_stop()
        a.request_stop()

        async def a_is_gone() -> bool:
            return [p["state"] for p in (await peers(http, b_url))["peers"]] != ["alive"]
        await until(a_is_gone, "node 1 to see node 0 leave")
        status, body = await send(b_url)
        assert status == 429, "node 0's spend was forgotten when it left"


BUDGET = """
model_memory_bytes = 100
min_residency_s = 0
"""


def budget_model(pinned: bool) -> str:
    return sim_model(time_scale=1.0, max_batch_size=4).replace(
        'backend = "sim"', f'backend = "sim"\nmemory_bytes = 100\npinned = {str(pinned).lower()}')


@contextlib.asynccontextmanager
async def cold_here_hot_there(tmp_path: Path, tenants: str = ""):
    """Two daemons under a budget serving `sim`: node 1 has it loaded (pinned), node 0 has it cold. Yields
    ((node 0, its URL), node 1, a client session) once node 0 has heard node 1 has it loaded."""
    (tmp_path / "cluster.key").write_text(KEY)
    async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        nodes, seeds = [], ""
        for i, pinned in enumerate((False, True)):
            d = tmp_path / f"node{i}"
            d.mkdir()
            (d / "cluster.key").write_text(KEY)
            path = write_config(d / "inferd.toml", {"sim": budget_model(pinned)},
                                cluster_text(seeds) + tenants)
            path.write_text(path.read_text().replace("[server]\n", "[server]\n" + BUDGET, 1))
            daemon, _, url = await stack.enter_async_context(running_daemon(load_config(path)))
            nodes.append((daemon, url))
            if i == 0:
                host, port = daemon.state.cluster.gossip.address
                seeds = f'"{host}:{port}"'
        (a, a_url), (b, _) = nodes
        await until(lambda: _has_hot(a), "node 0 to hear node 1 has sim loaded")
        yield (a, a_url), b, http


async def test_a_model_cold_here_goes_to_a_peer_that_has_it_loaded_instead_of_loading_it(tmp_path):
    # node 1 has `sim` loaded (pinned); node 0, under a memory budget, has it cold: it forwards, never loads
    async with cold_here_hot_there(tmp_path) as ((a, a_url), b, http):
        assert a.state.lifecycle.snapshot()["versions"]["sim@latest"]["state"] == "cold"
        async with http.post(a_url + "/v1/completions", json=SHORT) as resp:
            assert resp.status == 200
            assert resp.headers["X-Inferd-Node"] == b.state.cluster.node_id
            assert (await resp.json())["usage"]["completion_tokens"] == 4
        assert a.state.cluster.spillovers == {"forwarded_cold": 1}
        assert a.state.lifecycle.loads == {}                     # nothing loaded here for it
        assert a.state.lifecycle.snapshot()["versions"]["sim@latest"]["state"] == "cold"
        async with http.get(a_url + "/metrics") as resp:
            text = await resp.text()
        assert 'inferd_cluster_spillovers_total{outcome="forwarded_cold"} 1.0' in text
        assert any(line.startswith("inferd_requests_total{") and 'status="200"' in line   # counted where it arrived
                   for line in text.splitlines())
        # once no peer has it (node 1 leaves), node 0 loads it itself
        await b.state.cluster.leave()
        await until(lambda: _gone(a), "node 0 to hear node 1 left")
        async with http.post(a_url + "/v1/completions", json=SHORT) as resp:
            assert resp.status == 200
            assert resp.headers["X-Inferd-Node"] == a.state.cluster.node_id
        assert a.state.lifecycle.loads == {"success": 1}


async def test_a_cold_forward_settles_the_tenants_tokens_with_what_the_peer_reports(tmp_path):
    # this node's own bucket (not a share of the cluster's), so its level says exactly what was charged
    tenants = "shared_quotas = false\n[tenants.local]\ntokens_per_minute = 100000\nmax_concurrent_requests = 4\n"
    async with cold_here_hot_there(tmp_path, tenants) as ((a, a_url), b, http):
        quota = a.state.tenancy.quota
        frozen = time.monotonic()
        quota._clock = lambda: frozen                    # no refill while it runs: levels are exact
        level = lambda: quota._get("local").tpm.level(frozen)      # noqa: E731
        full = level()
        # refused by the peer (past the context): nothing ran, nothing stays charged
        async with http.post(a_url + "/v1/completions", json={"model": "sim", "prompt": "x" * 9000,
                                                                 "max_tokens": 2}) as resp:
            assert resp.status == 400
        assert level() == full
        # a chat whose template adds tokens beyond its characters: charged what the peer says it used
        body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        async with http.post(a_url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            used = (await resp.json())["usage"]["total_tokens"]
        assert level() == full - used
        assert quota._get("local").in_flight == 0


async def test_a_client_leaving_a_cold_forward_gives_its_concurrency_slot_back(tmp_path):
    tenants = "\n[tenants.local]\nmax_concurrent_requests = 4\n"
    async with cold_here_hot_there(tmp_path, tenants) as ((a, a_url), b, http):
        quota = a.state.tenancy.quota
        task = asyncio.ensure_future(http.post(a_url + "/v1/completions", json={**LONG, "max_tokens": 400}))
        await until(lambda: _forwarding(a), "node 0 to forward the request")
        task.cancel()                                     # a non-stream answer: nothing came back yet
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await until(lambda: _slot_back(quota), "node 0 to give the tenant's slot back")


async def _forwarding(a) -> bool:
    return a.state.tenancy.quota._get("local").in_flight == 1


async def _slot_back(quota) -> bool:
    return quota._get("local").in_flight == 0


async def _has_hot(a) -> bool:
    return a.state.cluster.peer_with_room("sim", None) is not None


async def _gone(a) -> bool:
    return a.state.cluster.peer_with_room("sim", None) is None
