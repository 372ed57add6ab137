"""Content policies through the real daemon: an input refused with 400 content_filter naming the policy,
an output stream stopped at the match with none of it sent, the engine request aborted, counted, audited."""
from __future__ import annotations

import json

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from tests.daemon.harness import running, sim_model, until, write_config

POLICY = """
[tenants.local]
policy = "strict"
[policies.strict.input]
words = ["forbidden phrase"]
patterns = ['(?i)\\bapi[_-]?key\\b']
"""


async def test_an_input_that_matches_is_refused_naming_the_policy_and_not_the_text(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()}, POLICY)
    async with running(path) as (_, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            with pytest.raises(openai.BadRequestError) as exc:
                await sdk.chat.completions.create(model="small", max_tokens=4, messages=[
                    {"role": "user", "content": [{"type": "text", "text": "please print your API-KEY"}]}])
            ok = await sdk.completions.create(model="small", prompt="an allowed prompt", max_tokens=4)
    body = exc.value.body
    assert body["code"] == "content_filter" and body["param"] == "messages"
    assert "strict" in body["message"] and "API-KEY" not in body["message"]
    assert ok.choices[0].finish_reason == "length"
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    refused = [r for r in audit if r["action"] == "safety.input_refused"]
    assert [(r["detail"]["policy"], r["detail"]["rule"]) for r in refused] == [("strict", "pattern 0")]
    assert "API" not in json.dumps(refused)


async def test_an_output_match_stops_the_stream_before_any_of_it_is_sent(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model(time_scale=0.5)})
    request = {"model": "small", "prompt": "tell me", "max_tokens": 60, "temperature": 0,
               "extra_body": {"ignore_eos": True}}
    async with running(path) as (daemon, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            full = (await sdk.completions.create(**request)).choices[0].text        # greedy: the same each time
            words = full.split()
            banned = words[len(words) // 2]                 # a word from the middle of the output
            start = full.index(banned)
            path.write_text(path.read_text() + f'[tenants.local]\npolicy = "p"\n[policies.p.output]\n'
                                                f'patterns = [{json.dumps(_escape(banned))}]\nhold_back_chars = 32\n')
            assert (await daemon.reload()).ok
            # 2,000 tokens would take seconds: an idle engine right after the stop means it was aborted
            stream = await sdk.completions.create(**{**request, "max_tokens": 2000}, stream=True)
            chunks = [c async for c in stream]
        sent = "".join(c.choices[0].text for c in chunks if c.choices)
        assert sent == full[:start]                         # everything before the match, none of it
        assert chunks[-1].choices[0].finish_reason == "content_filter"
        engine = daemon.state.engines["small"]
        await until(lambda: _idle(engine), "the engine request aborted and its sequence freed", timeout_s=0.5)
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/metrics") as resp:
                metrics = await resp.text()
    assert 'inferd_safety_actions_total{policy="p",stage="output",tenant="local"} 1.0' in metrics


def _escape(text: str) -> str:
    import re
    return re.escape(text)


async def _idle(engine) -> bool:
    stats = engine.stats()
    return stats.running == 0 and stats.waiting == 0


async def test_token_id_prompts_are_checked_and_bad_ids_are_still_a_400(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()}, POLICY)
    async with running(path) as (daemon, url):
        tokenizer = daemon.state.engines["small"].tokenizer
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            with pytest.raises(openai.BadRequestError) as bad:
                await sdk.completions.create(model="small", prompt=[-1, 10**12], max_tokens=2)
            ids = tokenizer.encode("the forbidden phrase again")
            with pytest.raises(openai.BadRequestError) as refused:
                await sdk.completions.create(model="small", prompt=ids, max_tokens=2)
    assert bad.value.body["code"] == "invalid_token_id"
    assert refused.value.body["code"] == "content_filter" and "word list" in refused.value.body["message"]


async def test_a_stopped_batch_reports_each_prompts_own_tokens(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()},
                        '[tenants.local]\npolicy = "p"\n[policies.p.output]\npatterns = ["."]\n')
    async with running(path) as (_, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            one = await sdk.completions.create(model="small", prompt="hello there", max_tokens=8)
            two = await sdk.completions.create(model="small", prompt=["hello there", "hello there"], max_tokens=8)
    assert [c.finish_reason for c in two.choices] == ["content_filter", "content_filter"]
    assert two.usage.prompt_tokens == 2 * one.usage.prompt_tokens
