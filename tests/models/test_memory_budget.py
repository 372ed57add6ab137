"""The model lifecycle through the real daemon: more models than fit a memory budget, loaded when asked
for and evicted when idle (inferd.models.memory_budget), as the official SDK and a raw HTTP client see it.

Sim models of the tiny profile with `simulate_load`: a load takes the profile's load time (0.52 s) times
the model's time_scale. Each model declares `memory_bytes = 100`, so a budget of 200 holds two.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from inferd.config.root import load_config
from inferd.models import run_prewarm_schedule
from tests.daemon.harness import running_daemon


def lifecycle_config(tmp_path: Path, models: dict[str, dict], *, budget: int = 200, min_residency_s: float = 0.0,
                     extra: str = "") -> Path:
    text = (f'[server]\nport = 0\ndrain_grace_s = 0\nmodel_memory_bytes = {budget}\n'
            f'min_residency_s = {min_residency_s}\nheartbeat_interval_s = 0.2\n[audit]\npath = "audit.jsonl"\n')
    for name, m in models.items():
        scale = m.get("time_scale", 1.0)
        text += (f'[models.{name}]\nbackend = "{m.get("backend", "sim")}"\nmemory_bytes = {m.get("bytes", 100)}\n'
                 f'pinned = {str(m.get("pinned", False)).lower()}\nprewarm = {str(m.get("prewarm", False)).lower()}\n'
                 f'prewarm_at = {json.dumps(m.get("prewarm_at", []))}\n')
        if m.get("backend", "sim") == "sim":
            text += (f'[models.{name}.sim]\nprofile = "tiny"\nsimulate_load = true\ntime_scale = {scale}\n'
                     f'max_model_len = 512\n')
        else:
            text += f'artifact = "{m["artifact"]}"\nnum_kv_blocks = 64\n'
    path = tmp_path / "inferd.toml"
    path.write_text(text + extra)
    return path


class Node:
    def __init__(self, daemon, url: str, http: aiohttp.ClientSession, sdk: AsyncOpenAI) -> None:
        self.daemon, self.url, self.http, self.sdk = daemon, url, http, sdk

    @property
    def lifecycle(self):
        return self.daemon.state.lifecycle

    def states(self) -> dict[str, str]:
        return {k.partition("@")[0]: v["state"] for k, v in self.lifecycle.snapshot()["versions"].items()}

    async def complete(self, model: str, **kw):
        return await self.sdk.completions.create(model=model, prompt="hi", max_tokens=2, **kw)

    async def post(self, model: str, **headers: str) -> aiohttp.ClientResponse:
        resp = await self.http.post(self.url + "/v1/completions", headers=headers,
                                    json={"model": model, "prompt": "hi", "max_tokens": 2})
        await resp.read()
        return resp


class serve:
    def __init__(self, path: Path) -> None:
        self.path = path

    async def __aenter__(self) -> Node:
        self._daemon = running_daemon(load_config(self.path))
        daemon, _, url = await self._daemon.__aenter__()
        self._http = aiohttp.ClientSession()
        self._sdk = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        return Node(daemon, url, self._http, self._sdk)

    async def __aexit__(self, *exc) -> None:
        await self._sdk.close()
        await self._http.close()
        await self._daemon.__aexit__(*exc)


THREE = {"a": {}, "b": {}, "c": {}}


async def until(condition, timeout: float = 10.0) -> None:
    """A lifecycle state reached (the lifecycle has no event for each; its states change on the loop)."""
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


async def test_a_budget_for_two_of_three_serves_requests_alternating_between_all_three(tmp_path):
    async with serve(lifecycle_config(tmp_path, THREE)) as n:
        assert n.states() == {"a": "cold", "b": "cold", "c": "cold"}
        async with n.http.get(n.url + "/readyz") as resp:        # all cold, and still ready to serve
            assert resp.status == 200
            assert (await resp.json())["residency"]["used_bytes"] == 0
        served = []
        for model in "abcabcab":
            got = await n.complete(model)
            served.append(got.model.partition("@")[0])
            assert n.states()[model] == "hot"
            assert sum(s == "hot" for s in n.states().values()) <= 2
        assert served == list("abcabcab")
        lc = n.lifecycle
        assert lc.loads == {"success": 8} and lc.evictions == {"lru": 6}
        # concurrent requests for all three at once: every one is served, none lost or hung
        got = await asyncio.wait_for(asyncio.gather(*(n.complete(m) for m in "abcabc")), 30)
        assert [g.model.partition("@")[0] for g in got] == list("abcabc")
        rows = {m.id: m for m in (await n.sdk.models.list()).data}
        assert {name: rows[name].model_extra["residency"] for name in "abc"} == n.states()


async def test_concurrent_requests_for_a_cold_model_share_one_load(tmp_path):
    async with serve(lifecycle_config(tmp_path, THREE)) as n:
        got = await asyncio.gather(*(n.complete("a") for _ in range(5)))
        assert len(got) == 5 and n.lifecycle.loads == {"success": 1}


async def test_hysteresis_keeps_recently_used_models_and_says_when_to_retry(tmp_path):
    async with serve(lifecycle_config(tmp_path, THREE, min_residency_s=1.0)) as n:
        await n.complete("a")
        await n.complete("b")
        await n.complete("a")                     # a used last: b is the least recently used
        refused = await n.post("c")
        assert refused.status == 503
        err = (await refused.json())["error"]
        assert err["code"] == "no_room_for_model" and err["param"] == "model"
        assert refused.headers["Retry-After"] == "1"
        await asyncio.sleep(1.05)                 # the minimum residency, not a wait for an event
        await n.complete("c")
        assert n.states() == {"a": "hot", "b": "cold", "c": "hot"}


async def test_pinned_models_are_loaded_at_start_and_never_evicted(tmp_path):
    models = {"a": {}, "b": {}, "p": {"pinned": True}}
    async with serve(lifecycle_config(tmp_path, models)) as n:
        assert n.states()["p"] == "hot"
        for model in "abab":
            await n.complete(model)
            assert n.states()["p"] == "hot"
        assert n.lifecycle.evictions == {"lru": 3}
        async with n.http.post(n.url + "/admin/models/p/unload") as resp:
            assert resp.status == 409 and (await resp.json())["error"]["code"] == "model_pinned"


async def test_a_request_whose_deadline_cannot_wait_for_the_load_gets_503_and_the_load_goes_on(tmp_path):
    async with serve(lifecycle_config(tmp_path, {"slow": {"time_scale": 4.0}, "b": {}})) as n:
        refused = await n.post("slow", **{"X-Request-Timeout": "0.5"})    # the load takes ~2.1 s
        assert refused.status == 503
        assert (await refused.json())["error"]["code"] == "model_loading"
        assert refused.headers["Retry-After"] in ("2", "3")
        assert n.states()["slow"] == "loading"
        got = await n.complete("slow")            # a patient client shares the load under way
        assert got.choices[0].text is not None and n.lifecycle.loads == {"success": 1}


async def test_a_stream_waiting_for_its_model_gets_headers_and_heartbeats_first(tmp_path):
    async with serve(lifecycle_config(tmp_path, {"slow": {"time_scale": 4.0}, "b": {}})) as n:
        body = {"model": "slow", "prompt": "hi", "max_tokens": 3, "stream": True}
        async with n.http.post(n.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            assert n.states()["slow"] == "loading"      # the headers came before the model was loaded
            lines = [line async for line in resp.content]
        text = b"".join(lines).decode()
        assert ": ping" in text and text.rstrip().endswith("data: [DONE]")
        chunks = [json.loads(x[6:]) for x in text.splitlines() if x.startswith("data: {")]
        assert chunks and all("error" not in c for c in chunks)


async def test_a_load_that_fails_leaves_the_others_serving_and_says_why(tmp_path):
    from inferd.artifacts.build.reference import build_synthetic

    engines = tmp_path / "engines"
    build_synthetic("tiny", engines, progress=lambda message: None)
    weights = next((engines / "tiny").glob("*/*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8] + b"corrupt!")      # no longer matches its manifest
    models = {"broken": {"backend": "reference", "artifact": "tiny", "bytes": 100}, "b": {}}
    path = lifecycle_config(tmp_path, models, extra=f'\n[server.x]\n'.replace("[server.x]\n", ""))
    path.write_text(path.read_text().replace("[server]\n", f'[server]\nengines_root = "{engines}"\n'))
    async with serve(path) as n:
        with pytest.raises(openai.InternalServerError) as exc:
            await n.complete("broken")
        assert exc.value.status_code == 503
        assert exc.value.body["code"] == "model_load_failed" and weights.name in exc.value.body["message"]
        assert (await n.complete("b")).model.startswith("b@")
        assert n.states() == {"broken": "cold", "b": "hot"}
        again = await n.post("broken")            # within the cool-down: the same answer at once
        assert again.status == 503 and (await again.json())["error"]["code"] == "model_load_failed"
        assert n.lifecycle.loads == {"failed": 1, "success": 1}
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["action"] for r in audit if r["action"].startswith("model.")] == ["model.load_failed", "model.load"]


async def test_admin_loads_ahead_of_traffic_and_unloads_and_both_are_audited(tmp_path):
    async with serve(lifecycle_config(tmp_path, THREE)) as n:
        async with n.http.post(n.url + "/admin/models/a/load") as resp:
            assert resp.status == 200 and (await resp.json())["state"] == "hot"
        assert n.lifecycle.cold_waits.count == 0       # a prewarm, not a request's cold start
        await n.complete("a")
        async with n.http.post(n.url + "/admin/models/a/unload") as resp:
            assert resp.status == 200 and (await resp.json())["state"] == "cold"
        async with n.http.post(n.url + "/admin/models/a/unload") as resp:
            assert resp.status == 409
        async with n.http.post(n.url + "/admin/models/nope/load") as resp:
            assert resp.status == 404
        async with n.http.get(n.url + "/metrics") as resp:
            text = await resp.text()
        assert 'inferd_model_residency{model="a",state="cold",version="latest"} 1.0' in text
        assert 'inferd_model_residency{model="a",state="hot",version="latest"} 0.0' in text
        assert 'inferd_model_evictions_total{reason="admin"} 1.0' in text
        assert 'inferd_model_load_seconds_count 1.0' in text
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["action"], r["reason"]) for r in audit if r["action"].startswith("model.")] == [
        ("model.load", "admin"), ("model.unload", "admin")]


class _Stop(Exception):
    pass


async def test_prewarm_and_a_prewarm_schedule_load_ahead_of_traffic(tmp_path):
    models = {"early": {"prewarm": True}, "daily": {"prewarm_at": ["08:00"]}, "c": {}}
    async with serve(lifecycle_config(tmp_path, models)) as n:
        assert n.states() == {"early": "hot", "daily": "cold", "c": "cold"}
        now, slept = [8 * 3600 - 5.0], []          # 07:59:55 UTC

        async def sleep(seconds: float) -> None:
            slept.append(seconds)
            if len(slept) > 1:
                raise _Stop                         # the day's load is done; the next is tomorrow
            now[0] += seconds

        with pytest.raises(_Stop):
            await run_prewarm_schedule(n.lifecycle, wall=lambda: now[0], sleep=sleep)
        assert slept == [5.0, 60.0] and n.states()["daily"] == "hot"
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in audit if r["action"] == "model.load"] == ["prewarm", "schedule"]


async def test_trtllm_versions_load_and_unload_as_engines_of_the_double(tiny_artifact, tmp_path):
    from tests.trtllm_double.harness import make_engine_dir, use_double

    with use_double() as controls:
        controls.step_time_s = 0.002
        text = lifecycle_config(tmp_path, {}, budget=100).read_text()
        for name in ("a", "b"):
            engine_dir = make_engine_dir(tmp_path / f"engine-{name}", tiny_artifact)
            text += (f'[models.{name}]\nbackend = "trtllm"\nmemory_bytes = 100\nverify = false\n'
                     f'[models.{name}.trtllm]\nengine_dir = "{engine_dir}"\nkv_cache_max_tokens = 1024\n')
        path = tmp_path / "inferd.toml"
        path.write_text(text)
        async with serve(path) as n:
            assert n.states() == {"a": "cold", "b": "cold"} and controls.calls == []
            await n.complete("a")
            table = n.daemon.state.registry.table
            (llm_a,) = [table.engine(k)._llm for k in table.versions if k.model == "a"]
            assert [c for c, _ in controls.calls].count("LLM") == 1
            await n.complete("b")                   # room for one: a's engine is shut down for b's
            assert n.states() == {"a": "cold", "b": "hot"}
            assert llm_a._executor.is_shutdown()
            assert [c for c, _ in controls.calls].count("LLM") == 2


# -- regressions from review ---------------------------------------------------------------------------


async def test_plain_lru_with_room_for_one_serves_two_models_asked_for_at_once(tmp_path):
    # min_residency_s = 0: a version just loaded must still reach the requests that waited for it
    path = lifecycle_config(tmp_path, {"a": {"time_scale": 0.2}, "b": {"time_scale": 0.2}}, budget=100)
    async with serve(path) as n:
        got = await asyncio.gather(*(n.post(m, **{"X-Request-Timeout": "8"}) for m in "abab"))
        assert [r.status for r in got] == [200] * 4
        assert n.lifecycle.loads["success"] <= 4


async def test_a_request_for_a_version_being_unloaded_is_503_not_500(tmp_path):
    async with serve(lifecycle_config(tmp_path, THREE)) as n:
        await n.complete("a")
        body = {"model": "a", "prompt": "hi", "max_tokens": 400, "stream": True}
        async with n.http.post(n.url + "/v1/completions", json=body) as stream:
            await stream.content.readline()                  # a stream on `a` is running
            unload = asyncio.ensure_future(n.http.post(n.url + "/admin/models/a/unload"))
            await until(lambda: n.states()["a"] == "draining")   # the admin's request reached the daemon
            refused = await n.post("a")
            assert refused.status == 503 and (await refused.json())["error"]["code"] == "model_unloading"
            await stream.read()
        async with await unload as resp:
            assert resp.status == 200
        assert (await n.post("a")).status == 200            # cold again: it loads


async def test_a_reload_during_a_load_leaves_the_load_alone(tmp_path):
    path = lifecycle_config(tmp_path, {"slow": {"time_scale": 3.0}, "b": {}}, budget=300)
    async with serve(path) as n:
        slow = asyncio.ensure_future(n.post("slow"))
        await until(lambda: n.states()["slow"] == "loading")
        result = await n.daemon.reloader.apply(load_config(path))      # the same file, SIGHUP'd
        assert result.ok and result.retired == ()
        assert (await slow).status == 200


async def test_a_stream_refused_after_its_early_headers_ends_with_an_error_frame(tmp_path):
    path = lifecycle_config(tmp_path, {"slow": {"time_scale": 4.0}, "b": {}},
                            extra="[tenants.local]\ntokens_per_minute = 600\n")
    async with serve(path) as n:
        body = {"model": "slow", "prompt": "hi", "max_tokens": 300, "stream": True}

        async def one() -> str:
            async with n.http.post(n.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200                    # its headers went out while the model loaded
                return (await asyncio.wait_for(resp.read(), 15)).decode()

        texts = await asyncio.gather(one(), one())           # room in the tenant's TPM for one of them
        refused = [t for t in texts if '"code":"quota_tpm"' in t]
        assert len(refused) == 1 and refused[0].rstrip().endswith("data: [DONE]")


async def test_a_version_a_reload_drops_is_not_kept_warm_beside_the_budget(tmp_path):
    models = {"a": {}, "b": {}, "c": {}}
    path = lifecycle_config(tmp_path, models, extra="")
    path.write_text(path.read_text().replace("[models.a]\n", "[models.a]\nkeep_warm_s = 30\n"))
    async with serve(path) as n:
        await n.complete("a")
        await n.complete("b")
        dropped = tmp_path / "dropped.toml"
        dropped.write_text(path.read_text().replace("[models.a]\nkeep_warm_s = 30\n", "[models.zz]\n")
                           .replace("[models.a.sim]", "[models.zz.sim]"))
        await n.daemon.reloader.apply(load_config(dropped))
        await n.daemon.reloader.wait_retired()
        await n.complete("c")
        await n.complete("zz")
        assert len(n.daemon.state.registry.table.versions) <= 2
        assert n.lifecycle.snapshot()["used_bytes"] <= 200 and "a@latest" not in n.lifecycle.snapshot()["versions"]


async def test_a_load_waiting_for_room_goes_as_soon_as_a_drain_frees_it(tmp_path):
    async with serve(lifecycle_config(tmp_path, {"a": {}, "b": {}}, budget=100)) as n:
        body = {"model": "a", "prompt": "hi", "max_tokens": 60, "stream": True}
        async with n.http.post(n.url + "/v1/completions", json=body) as stream:
            await stream.content.readline()                  # `a` is busy: b's load waits for it
            b = asyncio.ensure_future(n.post("b", **{"X-Request-Timeout": "20"}))
            await stream.read()
        t0 = asyncio.get_running_loop().time()
        assert (await b).status == 200
        assert asyncio.get_running_loop().time() - t0 < 5    # not the 30 s a missed wake-up would cost


async def test_a_reload_applies_a_new_budget_size_but_turning_it_off_needs_a_restart(tmp_path):
    path = lifecycle_config(tmp_path, THREE)
    async with serve(path) as n:
        bigger = tmp_path / "bigger.toml"
        bigger.write_text(path.read_text().replace("model_memory_bytes = 200", "model_memory_bytes = 300"))
        assert (await n.daemon.reloader.reload(bigger)).ok
        assert n.lifecycle.snapshot()["budget_bytes"] == 300
        off = tmp_path / "off.toml"
        off.write_text(path.read_text().replace("model_memory_bytes = 200\n", ""))
        assert (await n.daemon.reloader.reload(off)).ok
        assert n.daemon.state.config.server.model_memory_bytes == 300      # kept: a restart turns it off
        assert n.states() == {"a": "cold", "b": "cold", "c": "cold"}       # and nothing was loaded for it
