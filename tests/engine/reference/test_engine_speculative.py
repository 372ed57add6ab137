"""The reference engine with prompt-lookup speculation: same greedy output, the target's distribution sampled,
drafts counted, and requests that cannot or will not speculate decoded one token a step."""
from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from inferd.engine.reference.engine import ReferenceEngine
from inferd.engine.speculative import Speculation
from inferd.types import GenerationRequest, SamplingParams
from tests.engine.backends import started_engines
from tests.engine.speculative.copying import copying_prompts

TEXTS = ["the quick brown fox jumps over the lazy dog and the quick brown fox",
         "one two three one two three one two three", "we said", "how about that then"]
LENGTHS = [40, 33, 25, 37, 30, 28]


@pytest.fixture
async def make_engine(tiny_artifact, copying_model):
    def build(artifact: str = "tiny", **kwargs) -> ReferenceEngine:
        kwargs.setdefault("num_kv_blocks", 256)
        kwargs.setdefault("block_size", 4)
        return ReferenceEngine(tiny_artifact if artifact == "tiny" else copying_model[0], **kwargs)

    async with started_engines(build) as make:
        yield make


def prompts_for(engine, artifact: str, copying_model) -> list[list[int]]:
    return [engine.tokenizer.encode(t) for t in TEXTS] if artifact == "tiny" else copying_prompts(copying_model[1])


def request(rid: str, prompt: list[int], max_tokens: int, **sampling) -> GenerationRequest:
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("ignore_eos", True)
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(prompt),
                             sampling=SamplingParams(max_tokens=max_tokens, **sampling), tenant=rid)


async def run_all(engine, prefix: str, prompts: list[list[int]], opt_out=lambda i: False) -> list[list[int]]:
    streams = [engine.submit(request(f"{prefix}{i}", p, n, speculative=not opt_out(i)))
               for i, (p, n) in enumerate(zip(prompts, LENGTHS))]
    return [(await s.collect()).token_ids for s in streams]


@pytest.mark.parametrize("artifact", ["tiny", "copying"])
async def test_greedy_output_is_token_for_token_the_same_with_speculation_batched_with_requests_that_opted_out(
        make_engine, copying_model, artifact):
    """"tiny": noise, nearly every draft rejected; "copying": spans of the prompt, most drafts kept."""
    plain = await make_engine(artifact, max_num_tokens=24)
    prompts = prompts_for(plain, artifact, copying_model)
    expected = await run_all(plain, "p", prompts)
    spec = await make_engine(artifact, max_num_tokens=24, speculative=Speculation(num_tokens=4, min_n=1, max_n=3))
    # odd requests opt out: the batch mixes rows with drafts and rows without, and a small budget cuts drafts
    assert await run_all(spec, "s", prompts, opt_out=lambda i: i % 2 == 1) == expected
    stats = spec.stats()
    assert stats.speculation.verifications > 0 and stats.speculation.accepted_tokens <= stats.speculation.draft_tokens
    assert stats.generation_tokens_total == sum(LENGTHS[:len(prompts)])
    if artifact == "copying":
        assert stats.speculation.accepted_tokens > stats.speculation.draft_tokens / 2


async def test_a_request_copying_its_prompt_takes_a_fraction_of_the_steps(make_engine, copying_model):
    prompt = copying_prompts(copying_model[1])[0]
    steps = []
    for speculative in (None, Speculation(num_tokens=4, min_n=1, max_n=3)):
        engine = await make_engine("copying", speculative=speculative)
        before = engine.stats().steps_total            # the warm-up's
        result = await engine.submit(request("r", prompt, 40)).collect()
        steps.append(engine.stats().steps_total - before)
    assert len(result.token_ids) == 40
    assert steps[1] <= steps[0] / 4 + 2        # 4 drafts kept a step, and the target's own token


async def test_max_tokens_and_usage_hold_when_drafts_run_to_the_end(make_engine, copying_model):
    spec = await make_engine("copying", speculative=Speculation(num_tokens=8, min_n=1, max_n=2))
    prompt = copying_prompts(copying_model[1])[0]
    for n in (1, 2, 5, 9, 17):
        result = await spec.submit(request(f"m{n}", prompt, n)).collect()
        assert len(result.token_ids) == n and result.usage.completion_tokens == n
    assert spec.stats().speculation.accepted_tokens > 0


async def test_a_stop_string_inside_kept_drafts_ends_the_output_where_one_token_at_a_time_would(
        make_engine, copying_model):
    prompt = copying_prompts(copying_model[1])[0]
    plain = await make_engine("copying")
    full = await plain.submit(request("full", prompt, 40)).collect()
    stop = full.text[len(full.text) // 2:len(full.text) // 2 + 3]
    expected = await plain.submit(request("p", prompt, 40, stop=(stop,))).collect()
    assert expected.finish_reason.value == "stop"
    spec = await make_engine("copying", speculative=Speculation(num_tokens=6, min_n=1, max_n=3))
    got = await spec.submit(request("s", prompt, 40, stop=(stop,))).collect()
    assert (got.text, got.token_ids, got.usage, got.finish_reason) == (
        expected.text, expected.token_ids, expected.usage, expected.finish_reason)
    assert spec.stats().speculation.accepted_tokens > 0


async def test_requests_with_penalties_or_logprobs_are_not_drafted_for(make_engine, copying_model):
    spec = await make_engine("copying", speculative=Speculation(num_tokens=4, min_n=1, max_n=3))
    prompt = copying_prompts(copying_model[1])[0]
    await asyncio.gather(*(spec.submit(request(f"x{i}", prompt, 30, **kw)).collect() for i, kw in enumerate(
        [{"frequency_penalty": 0.5}, {"logprobs": 2}, {"speculative": False}, {"repetition_penalty": 1.2}])))
    assert spec.stats().speculation.draft_tokens == 0


@pytest.fixture(scope="module")
def copying_draft(copying_model, tmp_path_factory) -> Path:
    """A quarter-width, one-layer model with the copying model's successor chain and tokenizer."""
    from inferd.artifacts.build.copying import build_copying

    return build_copying("tiny", tmp_path_factory.mktemp("draft"), draft=True)[0]


@pytest.mark.parametrize("drafter", ["ngram", "draft_model"])
async def test_sampled_output_keeps_the_models_distribution_under_speculation(make_engine, copying_model,
                                                                              copying_draft, drafter):
    """Many seeded samples of 3 tokens: how often each position (and all three) follow the model's likeliest
    chain is the same with drafts as without, within sampling noise (a binomial's sd is under 0.016 here).
    A draft model's guesses are sampled from its own, flatter, distribution: the rule's q."""
    prompt = copying_prompts(copying_model[1])[0]
    plain = await make_engine("copying", max_batch_size=64)
    settings = Speculation(num_tokens=3, min_n=1, max_n=2) if drafter == "ngram" else Speculation(
        method="draft_model", num_tokens=2, draft_dir=str(copying_draft))
    spec = await make_engine("copying", max_batch_size=64, speculative=settings)
    chain = (await plain.submit(request("greedy", prompt, 3)).collect()).token_ids

    async def follows(engine, prefix: str) -> np.ndarray:
        streams = [engine.submit(request(f"{prefix}{i}", prompt, 3, temperature=1.0, seed=i)) for i in range(1000)]
        on_chain = np.array([(await s.collect()).token_ids for s in streams]) == np.array(chain)
        return np.append(on_chain.mean(axis=0), np.cumprod(on_chain, axis=1)[:, -1].mean())

    a, b = await follows(plain, "p"), await follows(spec, "s")
    stats = spec.stats().speculation
    assert 0 < stats.accepted_tokens < stats.draft_tokens         # some drafts kept, some not
    assert 0.2 < a[0] < 0.95                                      # a distribution, not an argmax
    assert np.abs(a - b).max() < 0.07, (a, b)


async def test_a_draft_model_gives_the_same_greedy_output_and_fewer_steps(make_engine, copying_model, copying_draft):
    prompts = copying_prompts(copying_model[1])
    plain = await make_engine("copying", max_num_tokens=24)
    expected = await run_all(plain, "p", prompts)
    spec = await make_engine("copying", max_num_tokens=24, speculative=Speculation(
        method="draft_model", num_tokens=3, draft_dir=str(copying_draft)))
    assert await run_all(spec, "s", prompts, opt_out=lambda i: i == 1) == expected
    stats = spec.stats().speculation
    # the draft follows the chain off the prompt too (the last two), where a prompt lookup finds nothing
    assert stats.accepted_tokens > 0.8 * stats.draft_tokens
    assert spec.memory_bytes() > plain.memory_bytes()                # the draft's weights and KV count too


async def test_a_draft_model_of_another_tokenizer_is_refused_at_load(copying_model, tiny_embed_artifact):
    from inferd.engine.speculative.draft_model import DraftModelMismatch

    # tiny-embed's tokenizer appends EOS to every text: not the same tokenizer, though the vocabulary is
    engine = ReferenceEngine(copying_model[0], num_kv_blocks=64, speculative=Speculation(
        method="draft_model", draft_dir=str(tiny_embed_artifact)))
    with pytest.raises(DraftModelMismatch, match="tokenizer"):
        await engine.start()
    await engine.close()


@pytest.mark.parametrize("drafter", ["ngram", "draft_model"])
async def test_greedy_output_holds_under_kv_pressure_shared_prefixes_and_aborts(make_engine, copying_model,
                                                                                copying_draft, drafter):
    """A pool too small for every sequence at once (preemptions and recomputes), identical prompts (the prefix
    cache and forks share blocks) and a request aborted mid-stream: the rest decode what they do without drafts."""
    prompts = copying_prompts(copying_model[1])
    prompts = [prompts[0], prompts[0], prompts[1], prompts[2], prompts[2], prompts[3]]
    settings = Speculation(num_tokens=4, min_n=1, max_n=3) if drafter == "ngram" else Speculation(
        method="draft_model", num_tokens=3, draft_dir=str(copying_draft))

    async def outputs(engine, prefix: str) -> list[list[int]]:
        streams = [engine.submit(request(f"{prefix}{i}", p, 40, **({"seed": i} if i % 2 else {})))
                   for i, p in enumerate(prompts)]
        doomed = engine.submit(request(f"{prefix}-gone", prompts[4], 60))
        await doomed.__anext__()
        doomed.cancel()                        # the client left: the engine aborts it
        return [(await s.collect()).token_ids for s in streams]

    plain = await make_engine("copying", num_kv_blocks=40, max_num_tokens=32)
    spec = await make_engine("copying", num_kv_blocks=40, max_num_tokens=32, speculative=settings)
    assert await outputs(spec, "s") == await outputs(plain, "p")
    assert spec.num_preemptions > 0 and spec.stats().speculation.accepted_tokens > 0
    assert spec.stats().kv_blocks_used == 0                 # everything freed, the aborted request's too
