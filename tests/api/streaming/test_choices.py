"""A list of prompts in /v1/completions: one choice per prompt, through the official SDK and LangChain."""
from __future__ import annotations

import httpx
import openai
import pytest

from inferd.api.pipeline.admit import SharedLease
from inferd.api.streaming.choices import merged_final
from inferd.config import TenantConfig
from inferd.types import Delta, FinishReason, Usage
from tests.api.conftest import metric_value, sim_engine

PROMPTS = ["first prompt", "the second", "and a third one"]


async def test_a_list_of_prompts_returns_one_indexed_choice_each_with_usage_summed(served):
    singles = [await served.sdk.completions.create(model="sim", prompt=p, max_tokens=5, temperature=0)
               for p in PROMPTS]
    resp = await served.sdk.completions.create(model="sim", prompt=PROMPTS, max_tokens=5, temperature=0)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert [c.text for c in resp.choices] == [s.choices[0].text for s in singles]
    assert all(c.finish_reason == "length" for c in resp.choices)
    assert resp.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert resp.usage.completion_tokens == 15
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 15


async def test_a_list_of_token_id_prompts_works_like_a_list_of_strings(served):
    tok = served.engine.tokenizer
    ids = [tok.encode(p) for p in PROMPTS[:2]]
    by_ids = await served.sdk.completions.create(model="sim", prompt=ids, max_tokens=4, temperature=0)
    by_text = await served.sdk.completions.create(model="sim", prompt=PROMPTS[:2], max_tokens=4, temperature=0)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]


async def test_streamed_choices_interleave_with_their_index_and_end_once_with_summed_usage(served):
    whole = await served.sdk.completions.create(model="sim", prompt=PROMPTS, max_tokens=8, temperature=0)
    stream = await served.sdk.completions.create(model="sim", prompt=PROMPTS, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    texts = {i: "" for i in range(3)}
    finishes = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason:
            assert choice.index not in finishes
            finishes[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(3)] == [c.text for c in whole.choices]
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert len({c.id for c in chunks}) == 1


async def test_langchain_completion_llm_batches_several_prompts_in_one_request(served):
    langchain_openai = pytest.importorskip("langchain_openai")
    async with httpx.AsyncClient() as http:     # ours, so its connections close with the test
        llm = langchain_openai.OpenAI(base_url=served.base_url + "/v1", api_key="x", model="sim", max_tokens=6,
                                      temperature=0, max_retries=0, http_async_client=http)
        texts = await llm.abatch(PROMPTS)
        result = await llm.agenerate(PROMPTS[:2])
    expected = await served.sdk.completions.create(model="sim", prompt=PROMPTS, max_tokens=6, temperature=0)
    assert texts == [c.text for c in expected.choices]
    assert [g[0].text for g in result.generations] == texts[:2]
    # abatch, agenerate and the SDK call: three requests answered, the prompts packed into each
    assert metric_value(await served.metrics_text(), "inferd_requests_total", status="200") == 3


async def test_a_batch_over_the_context_names_prompt_and_runs_nothing(served):
    with pytest.raises(openai.BadRequestError) as info:
        await served.sdk.completions.create(model="sim", prompt=["short", "word " * 600], max_tokens=4)
    assert info.value.body["param"] == "prompt" and info.value.body["code"] == "context_length_exceeded"
    assert served.engine.stats().steps_total == 0


async def test_a_batch_that_cannot_all_start_is_refused_whole_and_leaves_nothing_running(serve):
    # Two sequence slots for three long prompts: two start, the third cannot before the deadline, so
    # the request is refused and the two that started are aborted, their quota given back.
    served = await serve({"sim": sim_engine(max_batch_size=2, time_scale=1.0)})
    with pytest.raises(openai.APIStatusError) as info:
        await served.sdk.completions.create(model="sim", prompt=PROMPTS, max_tokens=400,
                                            extra_headers={"X-Request-Timeout": "0.5"})
    assert info.value.status_code in (429, 503, 504)
    assert await served.state.wait_idle(5.0)
    assert served.engine.stats().running == 0
    assert served.state.tenancy.quota.snapshot()["local"]["in_flight"] == 0


async def test_the_quota_counts_a_batch_as_one_request(serve):
    served = await serve(tenants={"local": TenantConfig(requests_per_minute=2)})
    await served.sdk.completions.create(model="sim", prompt=PROMPTS, max_tokens=3)   # one request of three
    await served.sdk.completions.create(model="sim", prompt="x", max_tokens=3)
    with pytest.raises(openai.RateLimitError):
        await served.sdk.completions.create(model="sim", prompt="x", max_tokens=3)


def test_a_shared_lease_goes_back_once_with_the_usage_of_every_share():
    released = []

    class Lease:
        def release(self, usage):
            released.append(usage)

    shared = SharedLease(Lease(), 3)
    a, b, c = shared.shares
    a.release(Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=1))
    a.release(Usage(prompt_tokens=50, completion_tokens=20))          # a share releases once
    b.release(None)                                                   # never ran: all its tokens come back
    assert released == []
    c.release(Usage(prompt_tokens=3, completion_tokens=4))
    assert released == [Usage(prompt_tokens=8, completion_tokens=6, cached_tokens=1)]


def test_a_shared_lease_whose_shares_never_ran_gives_everything_back():
    released = []

    class Lease:
        def release(self, usage):
            released.append(usage)

    for share in SharedLease(Lease(), 2).shares:
        share.release(None)
    assert released == [None]


async def test_a_client_that_leaves_a_streamed_batch_frees_every_choice(serve):
    served = await serve({"sim": sim_engine(time_scale=1.0)})
    stream = await served.sdk.completions.create(model="sim", prompt=PROMPTS, max_tokens=400, stream=True)
    seen = set()
    async for chunk in stream:
        seen |= {c.index for c in chunk.choices}
        if len(seen) == 3:
            break
    await stream.close()
    assert await served.state.wait_idle(5.0)
    assert served.engine.stats().running == 0       # the sim frees an aborted request in abort itself


def test_merged_usage_counts_every_choices_output_and_each_prompts_tokens_once():
    def final(prompt, out):
        return Delta(token_ids=[], finish_reason=FinishReason.LENGTH,
                     usage=Usage(prompt_tokens=prompt, completion_tokens=out, cached_tokens=prompt // 2))

    finals = [final(4, 1), final(4, 2), final(6, 3), final(6, 4)]        # two prompts, n=2, prompt-major
    assert merged_final(finals, 2).usage == Usage(prompt_tokens=10, completion_tokens=10, cached_tokens=5)
    assert merged_final(finals).usage.prompt_tokens == 20                  # a list of four prompts
    # ended abnormally with choices still running: the prompts that have an ended choice
    assert merged_final([None, final(4, 2), None, None], 2).usage.prompt_tokens == 4
