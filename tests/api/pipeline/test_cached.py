"""The response cache through the real daemon: opted-in tenants, deterministic requests, per tenant."""
from __future__ import annotations

import aiohttp
from openai import AsyncOpenAI

from inferd.tenancy.keys import KeyHasher, create_key
from tests.daemon.harness import running, sim_model, write_config

CONFIG = """
[auth]
mode = "api_key"
keys_file = "keys.jsonl"
[tenants.a]
cache_responses = true
[tenants.b]
cache_responses = true
[tenants.c]
"""
BODY = {"model": "small", "prompt": "cache me", "max_tokens": 12, "temperature": 0}


async def post(http, url, key, body, headers=None):
    async with http.post(url + "/v1/completions", json=body,
                         headers={"Authorization": f"Bearer {key}", **(headers or {})}) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers.get("X-Inferd-Cache"), await resp.json()


async def test_a_repeated_deterministic_request_is_a_hit_for_the_same_tenant_only(tmp_path):
    keys = {t: create_key(tmp_path / "keys.jsonl", KeyHasher(None), t)[1] for t in "abc"}
    path = write_config(tmp_path / "c.toml", {"small": sim_model(time_scale=0.2)}, CONFIG)
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        first = await post(http, url, keys["a"], BODY)
        second = await post(http, url, keys["a"], BODY)
        other_tenant = await post(http, url, keys["b"], BODY)
        not_opted_in = await post(http, url, keys["c"], BODY)
        sampled = await post(http, url, keys["a"], {**BODY, "temperature": 1.0})
        refreshed = await post(http, url, keys["a"], BODY, {"Cache-Control": "no-cache"})
        engine = daemon.state.engines["small"]
        steps = engine.stats().steps_total
        again = await post(http, url, keys["a"], BODY)
        assert engine.stats().steps_total == steps          # a hit runs nothing in the engine
    assert (first[0], second[0], other_tenant[0], not_opted_in[0], sampled[0], refreshed[0], again[0]) == \
        ("miss", "hit", "miss", None, None, "refresh", "hit")
    assert second[1]["choices"][0]["text"] == first[1]["choices"][0]["text"]
    assert second[1]["choices"][0]["finish_reason"] == "length"
    usage = second[1]["usage"]
    assert usage["completion_tokens"] == 12 and usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]


async def test_a_hit_replays_as_a_stream(tmp_path):
    key = create_key(tmp_path / "keys.jsonl", KeyHasher(None), "a")[1]
    path = write_config(tmp_path / "c.toml", {"small": sim_model()}, CONFIG)
    async with running(path) as (_, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as sdk:
            chunks = []
            for _ in range(2):
                raw = await sdk.completions.with_raw_response.create(**BODY, stream=True,
                                                                     stream_options={"include_usage": True})
                chunks.append((raw.headers.get("X-Inferd-Cache"), [c async for c in raw.parse()]))
    (miss, first), (hit, second) = chunks
    assert (miss, hit) == ("miss", "hit")
    text = lambda cs: "".join(c.choices[0].text for c in cs if c.choices)   # noqa: E731
    assert text(second) == text(first) and second[-1].usage.completion_tokens == 12


async def test_penalties_and_logit_bias_are_part_of_the_key(tmp_path):
    # every SamplingParams field is hashed: a request differing only in one of them is another entry
    keys = {"a": create_key(tmp_path / "keys.jsonl", KeyHasher(None), "a")[1]}
    path = write_config(tmp_path / "c.toml", {"small": sim_model(time_scale=0.0)}, CONFIG)
    variants = [{}, {"presence_penalty": 1.0}, {"frequency_penalty": 1.0}, {"logit_bias": {"5": 2}},
                {"logit_bias": {"5": 3}}, {"top_k": 5}, {"min_p": 0.1}, {"repetition_penalty": 1.1}]
    async with running(path) as (_, url), aiohttp.ClientSession() as http:
        first = [(await post(http, url, keys["a"], {**BODY, **v}))[0] for v in variants]
        again = [(await post(http, url, keys["a"], {**BODY, **v}))[0] for v in variants]
    assert first == ["miss"] * len(variants) and again == ["hit"] * len(variants)


async def test_a_logprobs_request_is_never_answered_from_a_plain_entry_and_its_own_hit_keeps_them(tmp_path):
    key = create_key(tmp_path / "keys.jsonl", KeyHasher(None), "a")[1]
    path = write_config(tmp_path / "c.toml", {"small": sim_model()}, CONFIG)
    with_logprobs = {**BODY, "logprobs": 2, "echo": True}
    async with running(path) as (_, url), aiohttp.ClientSession() as http:
        plain = await post(http, url, key, BODY)
        first = await post(http, url, key, with_logprobs)
        again = await post(http, url, key, with_logprobs)
    assert (plain[0], first[0], again[0]) == ("miss", "miss", "hit")
    assert plain[1]["choices"][0]["logprobs"] is None
    assert first[1]["choices"][0]["logprobs"]["token_logprobs"][0] is None
    assert again[1]["choices"][0] == first[1]["choices"][0]
