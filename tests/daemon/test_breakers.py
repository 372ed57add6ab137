"""Circuit breakers through the real daemon: a failing version rests, its requests go to the fallback
or get a quick 503, and /readyz, /metrics and the audit log say so."""
from __future__ import annotations

import json

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon.harness import running, sim_model, write_config

# Every request's first token is "too slow" for small's breaker: the way to make a healthy sim fail.
BREAKER = """
[models.small.breaker]
min_requests = 3
error_rate = 0.5
slow_ttft_s = 0.000001
cooldown_s = 60
"""


async def get(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            return resp.status, await resp.json() if resp.content_type == "application/json" else await resp.text()


async def test_an_open_breaker_sends_requests_to_the_fallback(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model(), "backup": sim_model()},
                        BREAKER + 'fallback = "backup"\n')
    async with running(path) as (_, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            served = [(await sdk.completions.create(model="small", prompt="hi", max_tokens=2)).model
                      for _ in range(5)]
            assert [m.partition("@")[0] for m in served] == ["small"] * 3 + ["backup"] * 2
        status, ready = await get(url + "/readyz")
        assert status == 200 and list(ready["breakers"].values()) == ["open"]
        _, metrics = await get(url + "/metrics")
    states = {s.labels["state"]: s.value for f in text_string_to_metric_families(metrics)
              if f.name == "inferd_circuit_breaker_state" for s in f.samples if s.labels["model"] == "small"}
    assert states == {"closed": 0, "open": 1, "half_open": 0}
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["action"], r["target"].partition("@")[0]) for r in audit if r["action"].startswith("breaker.")] == \
        [("breaker.open", "small")]


async def test_without_a_fallback_an_open_breaker_answers_503_at_once(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()}, BREAKER)
    async with running(path) as (_, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            for _ in range(3):
                await sdk.completions.create(model="small", prompt="hi", max_tokens=2)
            with pytest.raises(openai.APIStatusError) as exc:
                await sdk.completions.create(model="small", prompt="hi", max_tokens=2)
    assert exc.value.status_code == 503 and exc.value.body["code"] == "circuit_open"
    assert 50 <= int(exc.value.response.headers["Retry-After"]) <= 60


async def test_an_engine_that_went_unhealthy_trips_the_breaker_to_the_fallback(tmp_path):
    breaker = "[models.small.breaker]\nmin_requests = 2\ncooldown_s = 60\nfallback = \"backup\"\n"
    path = write_config(tmp_path / "c.toml", {"small": sim_model(), "backup": sim_model()}, breaker)
    async with running(path) as (daemon, url):
        daemon.state.engines["small"]._failed = True       # as a crashed step loop leaves it
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            for _ in range(2):
                with pytest.raises(openai.APIStatusError) as exc:
                    await sdk.completions.create(model="small", prompt="hi", max_tokens=2)
                assert exc.value.body["code"] == "engine_unavailable"
            served = await sdk.completions.create(model="small", prompt="hi", max_tokens=2)
    assert served.model.startswith("backup@")


async def test_requests_naming_an_adapter_do_not_trip_the_versions_breaker(tmp_path):
    head, sim, tail = sim_model().partition("[MODEL.sim]")
    model = head + 'lora_adapters = { ad1 = "" }\n' + sim + tail
    path = write_config(tmp_path / "c.toml", {"small": model}, BREAKER)
    async with running(path) as (daemon, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            # each one's first token is "slow" for the breaker: were they counted, it would open
            for _ in range(5):
                await sdk.completions.create(model="small:ad1", prompt="hi", max_tokens=2)
            await sdk.completions.create(model="small", prompt="hi", max_tokens=2)
        assert daemon.state.control.breakers.open_versions() == {}
