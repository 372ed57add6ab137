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


def gate_compiles(engine, monkeypatch):
    """Hold the engine's compiles until `release`; `threads` records where each ran."""
    import threading

    entered, release, threads = threading.Event(), threading.Event(), []
    real = engine.grammars._run_compiler

    def gated(compiler, guided):
        threads.append(threading.current_thread().name)
        entered.set()
        release.wait(60)
        return real(compiler, guided)

    monkeypatch.setattr(engine.grammars, "_run_compiler", gated)
    return entered, release, threads


async def test_a_grammar_missing_from_the_cache_compiles_off_the_step_thread_while_others_run(
        make_engine, monkeypatch):
    engine = await make_engine()
    entered, release, threads = gate_compiles(engine, monkeypatch)
    guided = engine.submit(req(engine, "evicted"))
    assert await asyncio.to_thread(entered.wait, 60)
    assert engine.capacity().waiting == 1            # still counted while it compiles
    # the step thread is free: a request without a grammar runs to its end while the compile is held
    plain = await asyncio.wait_for(engine.submit(req(engine, "plain", guided=None, max_tokens=4,
                                                     ignore_eos=True)).collect(), 60)
    assert plain.finish_reason is FinishReason.LENGTH
    release.set()
    out = await guided.collect()
    jsonschema.validate(json.loads(out.text), SCHEMA)
    assert threads and all(name.startswith("inferd-engine-grammar") for name in threads)
    assert engine.capacity().waiting == 0 and engine.capacity().free_kv_blocks == 256


async def test_a_request_aborted_while_its_grammar_compiles_ends_and_never_starts(make_engine, monkeypatch):
    engine = await make_engine()
    entered, release, _ = gate_compiles(engine, monkeypatch)
    stream = engine.submit(req(engine, "gone"))
    assert await asyncio.to_thread(entered.wait, 60)
    engine.abort("gone")
    out = await stream.collect()
    assert out.finish_reason is FinishReason.ABORT and out.token_ids == [] and out.usage.completion_tokens == 0
    assert engine.capacity().waiting == 0 and engine.capacity().free_kv_blocks == 256
    release.set()
    # the compile's end is dropped: the same id can run again, now from the cache
    again = await engine.submit(req(engine, "gone")).collect()
    assert again.finish_reason is FinishReason.STOP and engine.stats().running == 0


async def test_close_ends_a_request_whose_grammar_is_compiling(make_engine, monkeypatch):
    engine = await make_engine()
    entered, release, _ = gate_compiles(engine, monkeypatch)
    stream = engine.submit(req(engine, "closing"))
    assert await asyncio.to_thread(entered.wait, 60)
    await engine.close()
    release.set()
    out = await stream.collect()
    assert out.finish_reason is FinishReason.ABORT and out.token_ids == []
