"""`n`: n choices per prompt, each its own engine request, through the official SDK (the sim unless named)."""
from __future__ import annotations

import asyncio

import openai
import pytest

from inferd.config import TenantConfig
from inferd.engine.reference.engine import ReferenceEngine
from tests.api.conftest import metric_value

CHAT = [{"role": "user", "content": "tell me a story"}]


@pytest.fixture
async def reference(serve, tiny_artifact):
    engine = ReferenceEngine(tiny_artifact, num_kv_blocks=64, block_size=16, max_batch_size=8, max_num_tokens=64)
    return await serve({"tiny": engine})


async def test_n_3_gives_three_indexed_choices_and_usage_counts_every_choice_and_the_prompt_once(served):
    one = await served.sdk.chat.completions.create(model="sim", messages=CHAT, max_tokens=5, seed=4)
    resp = await served.sdk.chat.completions.create(model="sim", messages=CHAT, max_tokens=5, n=3, seed=4)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("length", "stop") for c in resp.choices)
    assert resp.choices[0].message.content == one.choices[0].message.content     # choice 0 has the seed itself
    assert len({c.message.content for c in resp.choices}) == 3                   # seed + 1, seed + 2 differ
    assert resp.usage.prompt_tokens == one.usage.prompt_tokens
    assert resp.usage.completion_tokens == 15 == sum(5 for _ in resp.choices)


async def test_streamed_n_choices_interleave_with_their_index_and_end_once_with_the_usage(served):
    whole = await served.sdk.completions.create(model="sim", prompt="once upon", max_tokens=6, n=3, seed=9)
    stream = await served.sdk.completions.create(model="sim", prompt="once upon", max_tokens=6, n=3, seed=9,
                                                 stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    texts = {i: "" for i in range(3)}
    finishes = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(3)] == [c.text for c in whole.choices]
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 18
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


async def test_a_list_of_two_prompts_with_n_2_gives_four_choices_prompt_major(served):
    prompts = ["first prompt", "the second"]
    singles = [await served.sdk.completions.create(model="sim", prompt=p, max_tokens=4, n=2, seed=1)
               for p in prompts]
    resp = await served.sdk.completions.create(model="sim", prompt=prompts, max_tokens=4, n=2, seed=1)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert [c.text for c in resp.choices] == [c.text for s in singles for c in s.choices]
    assert resp.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert resp.usage.completion_tokens == 16


async def test_seeded_n_choices_are_the_same_whatever_else_is_batched(reference):
    served = reference
    kwargs = dict(model="tiny", prompt="abc", max_tokens=6, n=3, seed=11, temperature=1.0)
    alone = await served.sdk.completions.create(**kwargs)
    noise = [served.sdk.completions.create(model="tiny", prompt="xyz", max_tokens=6, temperature=1.0) for _ in range(2)]
    again, *_ = await asyncio.gather(served.sdk.completions.create(**kwargs), *noise)
    assert [c.text for c in again.choices] == [c.text for c in alone.choices]


async def test_n_at_temperature_0_gives_identical_choices(reference):
    served = reference
    resp = await served.sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, n=4, temperature=0)
    assert len(resp.choices) == 4 and len({c.message.content for c in resp.choices}) == 1


@pytest.mark.parametrize("n", [17, 0])
async def test_n_outside_1_to_16_is_a_400_naming_n(served, n):
    with pytest.raises(openai.BadRequestError) as info:
        await served.sdk.completions.create(model="sim", prompt="a", n=n)
    assert info.value.body["param"] == "n"
    assert served.engine.stats().steps_total == 0


async def test_n_over_the_servers_max_n_is_a_400_naming_n(serve):
    served = await serve(max_n=2)
    await served.sdk.completions.create(model="sim", prompt="a", max_tokens=1, n=2)
    with pytest.raises(openai.BadRequestError) as info:
        await served.sdk.chat.completions.create(model="sim", messages=CHAT, max_tokens=1, n=3)
    assert info.value.body["param"] == "n" and "at most 2" in info.value.body["message"]


async def test_the_quota_charges_the_prompt_once_and_n_times_max_tokens_then_refunds_what_was_not_used(serve):
    # a minute's bucket of 2,000 tokens refills about 33 a second: levels below hold within a few tokens
    served = await serve(tenants={"local": TenantConfig(tokens_per_minute=2_000)})
    # a prompt long enough that counting it three times (once per choice) would be far outside the margins
    raw = await served.sdk.completions.with_raw_response.create(model="sim", prompt="one two three " * 20,
                                                                max_tokens=200, n=3, stop=["e"])
    resp = raw.parse()
    charged = 2_000 - int(raw.headers["X-RateLimit-Remaining-Tokens"])
    assert resp.usage.prompt_tokens > 40
    assert abs(charged - (resp.usage.prompt_tokens + 3 * 200)) <= 10           # at the charge, before the run
    assert resp.usage.completion_tokens < 600                                   # a stop string ended some early
    after = served.state.tenancy.quota.headers("local")["X-RateLimit-Remaining-Tokens"]
    used = resp.usage.prompt_tokens + resp.usage.completion_tokens     # the prompt once, as usage and billing
    assert abs((2_000 - int(after)) - used) <= 10


async def test_n_greater_than_1_is_kept_out_of_the_response_cache(serve):
    served = await serve(tenants={"local": TenantConfig(cache_responses=True)})
    for _ in range(2):
        raw = await served.sdk.completions.with_raw_response.create(model="sim", prompt="a", max_tokens=3, n=2,
                                                                   temperature=0)
        assert "X-Inferd-Cache" not in raw.headers
    text = await served.metrics_text()
    assert metric_value(text, "inferd_cache_lookups_total", result="hit") == 0


async def test_a_prompts_n_choices_fork_from_its_computed_prompt_on_the_reference_engine(reference):
    served = reference
    prompt = "a long enough prompt to fill more than one block of sixteen tokens " * 2
    singles = [await served.sdk.completions.create(model="tiny", prompt=prompt, max_tokens=24, seed=30 + j)
               for j in range(3)]
    resp = await served.sdk.completions.create(model="tiny", prompt=prompt, max_tokens=24, n=3, seed=30)
    # choices 1 and 2 start from choice 0's blocks while it runs (one prompt token each to compute; a
    # choice the engine gets after choice 0 ended uses the prefix cache instead), and sample what the
    # same seeds give alone: the shared and copied K/V is the prompt's
    assert served.engine._scheduler.num_forks >= 1
    assert [c.text for c in resp.choices] == [s.choices[0].text for s in singles]


async def test_n_choices_with_echo_and_logprobs_each_get_every_prompt_tokens_logprob(reference):
    """A choice that wants its prompt's log-probabilities computes its whole prompt: it never forks from
    another choice's blocks, which would leave it the last prompt token's only."""
    served = reference
    prompt = "a long enough prompt to fill more than one block of sixteen tokens " * 2
    resp = await served.sdk.completions.create(model="tiny", prompt=prompt, max_tokens=4, n=2, seed=3,
                                               echo=True, logprobs=1)
    first, second = (c.logprobs for c in resp.choices)
    assert len(first.tokens) == len(second.tokens) == resp.usage.prompt_tokens + 4
    assert first.token_logprobs[0] is None and second.token_logprobs[0] is None
    prompt_len = resp.usage.prompt_tokens
    assert first.token_logprobs[1:prompt_len] == pytest.approx(second.token_logprobs[1:prompt_len], abs=1e-6)


async def test_n_on_trtllm_sends_n_requests_each_with_n_1_and_its_own_seed(serve, tiny_artifact, tmp_path):
    from tests.trtllm_double.harness import trtllm_on_double      # noqa: PLC0415  (imports the double)

    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls                   # noqa: PLC0415

        served = await serve({"t": engine})
        controls.calls.clear()
        resp = await served.sdk.completions.create(model="t", prompt="hello", max_tokens=3, n=3, seed=40)
        assert [c.index for c in resp.choices] == [0, 1, 2] and resp.usage.completion_tokens == 9
        params = [kwargs["sampling_params"] for name, kwargs in controls.calls if name == "generate_async"]
        assert sorted(p.seed for p in params) == [40, 41, 42] and {p.n for p in params} == {1}


async def test_a_streamed_chat_with_n_announces_the_role_once_per_choice(served):
    whole = await served.sdk.chat.completions.create(model="sim", messages=CHAT, max_tokens=4, n=2, seed=3)
    stream = await served.sdk.chat.completions.create(model="sim", messages=CHAT, max_tokens=4, n=2, seed=3,
                                                      stream=True)
    roles, texts = {0: [], 1: []}, {0: "", 1: ""}
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.role:
                roles[choice.index].append(choice.delta.role)
            texts[choice.index] += choice.delta.content or ""
    assert roles == {0: ["assistant"], 1: ["assistant"]}
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]
