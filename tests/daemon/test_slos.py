"""SLOs through the real daemon: requests judged per SLI, burn rates and budgets on /metrics, reloads."""
from __future__ import annotations

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon.harness import running, sim_model, write_config

SLOS = """
[aliases.chat]
split = { "small" = 1 }
[tenants.local]
requests_per_minute = 5
[slos.avail]
model = "small"
sli = "availability"
objective = 0.999
[slos.chat-ttft]
model = "chat"
sli = "ttft"
threshold_ms = 0.001
objective = 0.99
[slos.streams]
model = "small"
sli = "stream_completion"
objective = 0.999
"""


async def slo_series(url: str) -> dict[tuple[str, ...], float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("inferd_slo_"):
            for s in family.samples:
                out[(s.name, s.labels["slo"], s.labels.get("result") or s.labels.get("window") or "")] = s.value
    return out


async def test_requests_are_judged_per_sli_and_burn_rates_follow(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model(time_scale=1.0)}, SLOS)
    path.write_text(path.read_text().replace("[server]\n", "[server]\nrequest_timeout_s = 0.3\n", 1))
    async with running(path) as (_, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            for _ in range(2):      # good streams; their first tokens miss the 1 us TTFT threshold
                stream = await sdk.chat.completions.create(model="chat", stream=True, max_tokens=4,
                                                           messages=[{"role": "user", "content": "hi"}])
                assert [c async for c in stream]
            done = await sdk.completions.create(model="small", prompt="hello", max_tokens=4)
            assert done.choices[0].text
            # a stream cut by the server's deadline: a failure of availability and of stream completion
            stream = await sdk.completions.create(model="small", prompt="hello", max_tokens=1000, stream=True)
            with pytest.raises(openai.APIError, match="deadline"):
                _ = [c async for c in stream]
            # one cut by a deadline its client chose shorter: no event of either
            stream = await sdk.completions.create(model="small", prompt="hello", max_tokens=1000, stream=True,
                                                  extra_headers={"X-Request-Timeout": "0.1"})
            with pytest.raises(openai.APIError, match="deadline"):
                _ = [c async for c in stream]
            more = 0
            with pytest.raises(openai.RateLimitError):      # soon over the tenant's 5 requests a minute
                for more in range(10):
                    await sdk.completions.create(model="small", prompt="hello", max_tokens=4)
        s = await slo_series(url)
    assert s[("inferd_slo_events_total", "avail", "good")] == 3 + more     # the quota refusal is no event
    assert s[("inferd_slo_events_total", "avail", "bad")] == 1
    assert s[("inferd_slo_events_total", "chat-ttft", "bad")] == 2     # only requests that asked for `chat`
    assert s[("inferd_slo_events_total", "chat-ttft", "good")] == 0
    assert s[("inferd_slo_events_total", "streams", "good")] == 2
    assert s[("inferd_slo_events_total", "streams", "bad")] == 1
    assert s[("inferd_slo_burn_rate", "avail", "5m")] == pytest.approx(1 / (4 + more) / 0.001)
    assert s[("inferd_slo_burn_rate", "chat-ttft", "3d")] == pytest.approx(100.0)
    assert s[("inferd_slo_error_budget_remaining", "avail", "")] == pytest.approx(1 - 1 / (4 + more) / 0.001)


async def test_a_reload_adds_slos_and_keeps_the_counts_of_unchanged_ones(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()}, SLOS)
    async with running(path) as (daemon, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            await sdk.completions.create(model="small", prompt="hello", max_tokens=4)
        path.write_text(path.read_text() + '[slos.more]\nmodel = "small"\nsli = "availability"\nobjective = 0.9\n')
        assert (await daemon.reload()).ok
        s = await slo_series(url)
    assert s[("inferd_slo_events_total", "avail", "good")] == 1
    assert s[("inferd_slo_events_total", "more", "good")] == 0


async def test_autoscaling_gauges_carry_the_hardware_label(tmp_path):
    head, sim, tail = sim_model().partition("[MODEL.sim]")
    models = {"small": sim_model(), "big": head + 'hardware = "h100-sxm"\n' + sim + tail}
    path = write_config(tmp_path / "c.toml", models)
    async with running(path) as (_, url):
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/metrics") as resp:
                text = await resp.text()
    fill = {s.labels["model"]: s.labels["hardware"] for f in text_string_to_metric_families(text)
            if f.name == "inferd_engine_batch_fill_ratio" for s in f.samples}
    assert fill == {"small": "tiny", "big": "h100-sxm"}      # the sim profile's name, or the configured label
