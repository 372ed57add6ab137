"""ReferenceEngine with a grammar (SamplingParams.guided): its output follows it, on the tiny synthetic model."""
from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from inferd.engine.reference.engine import ReferenceEngine
from inferd.types import FinishReason, GenerationRequest, GuidedDecoding, SamplingParams
from tests.engine.backends import started_engines

# Every value is bounded (a boolean, a digit, a choice), so even a random model completes it in a few tokens.
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "c": {"enum": ["red", "green"]}},
          "required": ["ok", "n", "c"], "additionalProperties": False}
GUIDED = GuidedDecoding(kind="json_schema", spec=json.dumps(SCHEMA, separators=(",", ":"), sort_keys=True))


@pytest.fixture
async def make_engine(tiny_artifact):
    def build(**kwargs) -> ReferenceEngine:
        kwargs.setdefault("num_kv_blocks", 256)
        kwargs.setdefault("block_size", 4)
        return ReferenceEngine(tiny_artifact, **kwargs)

    async with started_engines(build) as make:
        yield make


def req(engine, rid, text="a b c", max_tokens=64, guided=GUIDED, **sampling) -> GenerationRequest:
    sampling.setdefault("temperature", 0.0)
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode(text)),
                             sampling=SamplingParams(max_tokens=max_tokens, guided=guided, **sampling))


async def test_greedy_output_follows_the_schema_and_stops(make_engine):
    engine = await make_engine()
    out = await engine.submit(req(engine, "g", ignore_eos=True)).collect()
    assert out.finish_reason is FinishReason.STOP       # the grammar ended it, though ignore_eos is set
    jsonschema.validate(json.loads(out.text), SCHEMA)


async def test_sampled_outputs_follow_the_schema_under_batching(make_engine):
    engine = await make_engine(max_num_tokens=16)
    streams = [engine.submit(req(engine, f"s{i}", f"prompt {i}", temperature=1.5, seed=i)) for i in range(6)]
    outs = await asyncio.gather(*(s.collect() for s in streams))
    for out in outs:
        assert out.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(out.text), SCHEMA)


async def test_max_tokens_cut_says_length(make_engine):
    engine = await make_engine()
    out = await engine.submit(req(engine, "cut", max_tokens=3)).collect()
    assert out.finish_reason is FinishReason.LENGTH
    assert len(out.token_ids) == 3 and out.text.startswith("{")


async def test_choices_of_one_prompt_each_follow_the_grammar(make_engine):
    """n choices are sequences of one prompt: the later ones fork the first's prompt blocks, each with its own
    matcher."""
    engine = await make_engine()
    choice = GuidedDecoding(kind="choice", spec=json.dumps(["alpha", "beta", "gamma delta"]))
    streams = [engine.submit(req(engine, f"n{i}", "same prompt here", guided=choice, temperature=1.0, seed=i))
               for i in range(4)]
    outs = await asyncio.gather(*(s.collect() for s in streams))
    assert {o.text for o in outs} <= {"alpha", "beta", "gamma delta"}
    assert all(o.finish_reason is FinishReason.STOP for o in outs)


async def test_preempted_sequences_recompute_without_feeding_the_grammar_twice(make_engine):
    engine = await make_engine(num_kv_blocks=16, block_size=4)     # too few blocks: some get preempted
    streams = [engine.submit(req(engine, f"p{i}", f"prompt {i}", max_tokens=40, temperature=1.0, seed=i))
               for i in range(4)]
    outs = await asyncio.gather(*(s.collect() for s in streams))
    assert engine.num_preemptions > 0
    for out in outs:
        assert out.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(out.text), SCHEMA)


async def test_rows_without_a_grammar_are_unchanged(make_engine):
    engine = await make_engine()
    alone = await engine.submit(req(engine, "free1", guided=None, ignore_eos=True, max_tokens=12)).collect()
    streams = [engine.submit(req(engine, "free2", guided=None, ignore_eos=True, max_tokens=12)),
               engine.submit(req(engine, "guided", "other"))]
    mixed, guided = await asyncio.gather(*(s.collect() for s in streams))
    assert mixed.token_ids == alone.token_ids
    json.loads(guided.text)


async def test_logprobs_under_a_grammar_are_those_of_the_masked_logits(make_engine):
    engine = await make_engine()
    out = await engine.submit(req(engine, "lp", logprobs=5)).collect()
    # as vLLM: the grammar's mask comes before the sampler's raw logprobs, so at the first position the
    # alternatives the grammar forbids are -inf and those it allows share all the probability
    allowed = engine.grammars.matcher(GUIDED).allowed()
    first = out.logprobs[0]
    assert allowed[first.token_id] and first.logprob > float("-inf")
    assert all((lp == float("-inf")) == (not allowed[tid]) for tid, lp in first.top)


async def test_a_refused_grammar_submitted_directly_ends_with_its_message(make_engine):
    engine = await make_engine()
    out = await engine.submit(req(engine, "bad", guided=GuidedDecoding(kind="regex", spec="("))).collect()
    assert out.finish_reason is FinishReason.ERROR
    assert "parenthesis" in out.error
