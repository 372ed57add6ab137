"""Overload degradation through the real daemon: under queue pressure a class's max_tokens is capped, or
the class goes to another model; without pressure nothing changes."""
from __future__ import annotations

import asyncio
import json

import aiohttp
from openai import AsyncOpenAI

from tests.daemon.harness import running, sim_model, until, write_config

TENANT = '\n[tenants.local]\npriority = "batch"\nmax_concurrent_requests = 16\n'


async def post(http: aiohttp.ClientSession, url: str, model: str, max_tokens: int) -> tuple[dict, dict]:
    async with http.post(url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": max_tokens,
                                                         "ignore_eos": True}) as resp:
        assert resp.status == 200, await resp.text()
        return dict(resp.headers), await resp.json()


async def queued(daemon) -> int:
    return sum(q.pressure()[0] for _, _, q in daemon.state.tenancy.queues())


async def under_pressure(daemon, url: str, http: aiohttp.ClientSession) -> list[asyncio.Task]:
    """One long request holds small's only slot and a second waits behind it."""
    tasks = [asyncio.ensure_future(post(http, url, "small", 400)) for _ in range(2)]
    await until(lambda: queued(daemon), "a request waiting in admission")
    return tasks


async def test_a_degraded_class_gets_its_max_tokens_capped_only_under_pressure(tmp_path):
    extra = TENANT + "[degrade.small]\nqueued_over = 0\nmax_tokens = { batch = 3 }\n"
    path = write_config(tmp_path / "c.toml", {"small": sim_model(time_scale=1.0, max_batch_size=1)}, extra)
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        headers, body = await post(http, url, "small", 8)           # no pressure: as asked
        assert "X-Inferd-Degraded" not in headers and body["usage"]["completion_tokens"] == 8
        holders = await under_pressure(daemon, url, http)
        headers, body = await post(http, url, "small", 50)
        assert headers["X-Inferd-Degraded"] == "max_tokens=3"
        assert body["usage"]["completion_tokens"] == 3 and body["choices"][0]["finish_reason"] == "length"
        for t in holders:
            t.cancel()
        async with http.get(url + "/metrics") as resp:
            metrics = await resp.text()
    assert 'inferd_degraded_requests_total{action="max_tokens",route="small"} 1.0' in metrics


async def test_a_degraded_class_is_sent_to_the_smaller_model(tmp_path):
    extra = TENANT + '[degrade.small]\nqueued_over = 0\nroute = { batch = "mini" }\n'
    models = {"small": sim_model(time_scale=1.0, max_batch_size=1), "mini": sim_model()}
    path = write_config(tmp_path / "c.toml", models, extra)
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        holders = await under_pressure(daemon, url, http)
        headers, body = await post(http, url, "small", 4)
        assert headers["X-Inferd-Degraded"] == "route=mini" and body["model"].startswith("mini@")
        for t in holders:
            t.cancel()


async def test_batch_fill_degrades_before_anything_queues(tmp_path):
    extra = TENANT + "[degrade.small]\nbatch_fill_over = 0.4\nmax_tokens = { batch = 2 }\n"
    path = write_config(tmp_path / "c.toml", {"small": sim_model(time_scale=1.0, max_batch_size=2)}, extra)
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        holder = asyncio.ensure_future(post(http, url, "small", 400))      # one of the two slots
        engine = daemon.state.engines["small"]
        await until(lambda: _running(engine), "the long request running")
        headers, body = await post(http, url, "small", 50)
        assert headers["X-Inferd-Degraded"] == "max_tokens=2" and body["usage"]["completion_tokens"] == 2
        assert await queued(daemon) == 0
        holder.cancel()


async def _running(engine) -> bool:
    return engine.stats().running == 1


async def test_a_class_whose_smaller_model_cannot_take_it_stays_where_it_was_routed(tmp_path):
    mini_breaker = "[models.mini.breaker]\nmin_requests = 1\nslow_ttft_s = 0.000001\ncooldown_s = 60\n"
    extra = TENANT + '[degrade.small]\nqueued_over = 0\nroute = { batch = "mini" }\n' + mini_breaker
    models = {"small": sim_model(time_scale=1.0, max_batch_size=1), "mini": sim_model()}
    path = write_config(tmp_path / "c.toml", models, extra)
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        await post(http, url, "mini", 2)                 # mini's breaker opens: its first token was "slow"
        assert daemon.state.control.breakers.open_versions()
        holders = await under_pressure(daemon, url, http)
        headers, body = await post(http, url, "small", 4)
        assert "X-Inferd-Degraded" not in headers and body["model"].startswith("small@")
        for t in holders:
            t.cancel()


async def test_a_batch_jobs_line_degraded_to_an_alias_takes_that_alias_batch_tier(tmp_path):
    extra = ('\n[tenants.local]\npriority = "standard"\n'
             '[aliases.cheap]\nsplit = { "mini@a" = 1 }\n[aliases.cheap.tiers]\nbatch = "mini@b"\n'
             '[degrade.small]\nbatch_fill_over = 0.5\nroute = { batch = "cheap" }\n')
    # small's one slot stays taken until the test lets go, however long the batch runner takes to reach the line
    models = {"small": sim_model(time_scale=10.0, max_batch_size=1), "mini": sim_model(["b"], version="a")}
    path = write_config(tmp_path / "c.toml", models, extra)
    line = json.dumps({"custom_id": "c0", "method": "POST", "url": "/v1/completions",
                       "body": {"model": "small", "prompt": "hi", "max_tokens": 2}}) + "\n"
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        holder = asyncio.ensure_future(post(http, url, "small", 400))      # small's only slot
        await until(lambda: _running(daemon.state.engines["small"]), "the long request running")
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            made = await sdk.files.create(file=("in.jsonl", line.encode()), purpose="batch")
            batch = await sdk.batches.create(input_file_id=made.id, endpoint="/v1/completions",
                                             completion_window="24h")

            async def ended() -> bool:
                nonlocal batch
                batch = await sdk.batches.retrieve(batch.id)
                return batch.status in ("completed", "failed", "expired", "cancelled")

            await until(ended, "the batch job", timeout_s=20)
            out = json.loads((await sdk.files.content(batch.output_file_id)).text)
        holder.cancel()
    assert out["response"]["body"]["model"].partition("+")[0] == "mini@b"       # not the split's mini@a
