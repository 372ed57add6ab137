"""Log-probabilities from the reference engine: raw log_softmax of the model's logits (transformers' values for
the same checkpoint), for generated tokens and for every prompt token, through chunked prefill and batching."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.reference.engine import ReferenceEngine
from inferd.types import GenerationRequest, SamplingParams
from tests.engine.backends import started_engines

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5")

PROMPT = "one of the most common words in the language is the"


@pytest.fixture
async def make_engine(tiny_artifact):
    def build(**kwargs) -> ReferenceEngine:
        kwargs.setdefault("num_kv_blocks", 256)
        kwargs.setdefault("block_size", 4)
        return ReferenceEngine(tiny_artifact, **kwargs)

    async with started_engines(build) as make:
        yield make


@pytest.fixture(scope="module")
def hf_model(tiny_artifact):
    return transformers.LlamaForCausalLM.from_pretrained(tiny_artifact, torch_dtype=torch.float32).eval()


def hf_log_softmax(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1).numpy()


def request(engine, rid: str, max_tokens: int = 6, tenant: str | None = None, **sampling) -> GenerationRequest:
    sampling.setdefault("temperature", 0.0)
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode(PROMPT)),
                             tenant=tenant or rid,
                             sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling))


def assert_matches(entries, ids: list[int], expected: np.ndarray, k: int) -> None:
    """entries[i] scores ids[i] with the distribution expected[i] (HF's log_softmax rows)."""
    assert len(entries) == len(ids) == len(expected)
    for entry, token, row in zip(entries, ids, expected):
        assert entry.token_id == token
        assert abs(entry.logprob - row[token]) <= 1e-4
        top_ids = [t for t, _ in entry.top]
        assert top_ids == np.argsort(-row, kind="stable")[:k].tolist()
        np.testing.assert_allclose([v for _, v in entry.top], row[top_ids], atol=1e-4)


@pytest.mark.parametrize("max_num_tokens", [512, 5])      # whole prompt in one step; chunks of 5 with others
async def test_token_and_prompt_logprobs_equal_transformers_log_softmax(make_engine, hf_model, max_num_tokens):
    engine = await make_engine(max_num_tokens=max_num_tokens)
    other = engine.submit(request(engine, "other", max_tokens=8))          # batched alongside, wants none
    out = await engine.submit(request(engine, "lp", logprobs=5, prompt_logprobs=3)).collect()
    plain = await other.collect()
    prompt = list(engine.tokenizer.encode(PROMPT))
    expected = hf_log_softmax(hf_model, prompt + out.token_ids)
    assert plain.logprobs is None and plain.prompt_logprobs is None
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    assert_matches(out.prompt_logprobs[1:], prompt[1:], expected[:len(prompt) - 1], 3)
    assert_matches(out.logprobs, out.token_ids, expected[len(prompt) - 1:-1], 5)
    assert all(e.top[0][0] == e.token_id for e in out.logprobs)              # greedy: the top one


async def test_sampled_tokens_report_raw_logprobs_not_tempered_ones(make_engine, hf_model):
    engine = await make_engine()
    out = await engine.submit(request(engine, "hot", temperature=1.7, seed=3, logprobs=0)).collect()
    prompt = list(engine.tokenizer.encode(PROMPT))
    expected = hf_log_softmax(hf_model, prompt + out.token_ids)
    assert_matches(out.logprobs, out.token_ids, expected[len(prompt) - 1:-1], 0)


async def test_prompt_logprobs_skip_the_prefix_cache_and_come_once(make_engine):
    engine = await make_engine()
    await engine.submit(request(engine, "warm", max_tokens=2, tenant="t")).collect()    # fills the prefix cache
    hit = await engine.submit(request(engine, "hit", max_tokens=2, tenant="t")).collect()
    again = await engine.submit(request(engine, "lp", max_tokens=2, tenant="t", prompt_logprobs=0)).collect()
    assert hit.usage.cached_tokens > 0 and again.usage.cached_tokens == 0
    assert len(again.prompt_logprobs) == again.usage.prompt_tokens and again.logprobs is None
