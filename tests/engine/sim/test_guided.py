"""The sim's structured output (inferd.engine.sim.guided): synthetic tokens obey the grammar, so the output parses."""
from __future__ import annotations

import asyncio
import itertools
import json
import re

import jsonschema
import pytest

from inferd.engine.sim.engine import SimEngine
from inferd.types import Delta, FinishReason, GenerationRequest, GuidedDecoding, SamplingParams
from tests.engine.backends import started_engines

_ids = itertools.count()
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags", "age", "ok"],
          "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
                         "age": {"type": "integer", "minimum": 0}, "ok": {"type": "boolean"},
                         "score": {"type": "number"}}}
GUIDED = GuidedDecoding(kind="json_schema", spec=json.dumps(SCHEMA, separators=(",", ":"), sort_keys=True))


@pytest.fixture
async def make_engine():
    def build(profile="tiny", **kwargs) -> SimEngine:
        kwargs.setdefault("time_scale", 0.0)
        return SimEngine(profile, **kwargs)

    async with started_engines(build) as make:
        yield make


def submit(engine: SimEngine, guided: GuidedDecoding | None = GUIDED, prompt=(300, 301, 302), **params):
    params.setdefault("max_tokens", 400)
    return engine.submit(GenerationRequest(request_id=f"g-{next(_ids)}", prompt_token_ids=tuple(prompt),
                                           sampling=SamplingParams(guided=guided, **params)))


async def finish(stream) -> Delta:
    return await asyncio.wait_for(stream.collect(), 30)


async def test_output_follows_the_json_schema_and_ends_with_stop(make_engine):
    engine = await make_engine()
    outs = [await finish(submit(engine, prompt=(300 + i, 5, 6), temperature=1.0, seed=i)) for i in range(20)]
    for out in outs:
        assert out.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(out.text), SCHEMA)
        assert out.text == engine.tokenizer.decode(out.token_ids)
    assert len({o.text for o in outs}) > 10          # different prompts and seeds, different objects


async def test_same_request_same_output(make_engine):
    engine = await make_engine()
    first, second = [await finish(submit(engine, temperature=0.0)) for _ in range(2)]
    assert first.text == second.text


async def test_ignore_eos_still_ends_when_the_grammar_does(make_engine):
    engine = await make_engine()
    out = await finish(submit(engine, ignore_eos=True))
    assert out.finish_reason is FinishReason.STOP
    json.loads(out.text)


async def test_max_tokens_cut_says_length(make_engine):
    engine = await make_engine()
    out = await finish(submit(engine, max_tokens=4))
    assert out.finish_reason is FinishReason.LENGTH and len(out.token_ids) == 4


@pytest.mark.parametrize(("guided", "check"), [
    (GuidedDecoding(kind="json_object"), lambda text: isinstance(json.loads(text), dict)),
    (GuidedDecoding(kind="regex", spec="[a-z]{3}-[0-9]{2,4}"), lambda t: re.fullmatch("[a-z]{3}-[0-9]{2,4}", t)),
    (GuidedDecoding(kind="choice", spec='["yes","no","maybe so"]'), lambda t: t in ("yes", "no", "maybe so")),
    (GuidedDecoding(kind="grammar", spec='root ::= "(" [0-9]+ ")"'), lambda t: re.fullmatch(r"\(\d+\)", t)),
])
async def test_every_kind_of_grammar_is_obeyed(make_engine, guided, check):
    engine = await make_engine()
    for seed in range(5):
        out = await finish(submit(engine, guided, temperature=1.0, seed=seed))
        assert out.finish_reason is FinishReason.STOP and check(out.text), out.text


async def test_many_choices_batched_each_follow_the_grammar(make_engine):
    engine = await make_engine()
    streams = [submit(engine, temperature=1.0, seed=i) for i in range(8)]      # n=8 of one prompt
    outs = await asyncio.gather(*(finish(s) for s in streams))
    for out in outs:
        jsonschema.validate(json.loads(out.text), SCHEMA)


async def test_preemption_keeps_outputs_valid(make_engine):
    engine = await make_engine(num_kv_blocks=12, block_size=4)
    streams = [submit(engine, prompt=(300 + i,) * 6, temperature=1.0, seed=i, max_tokens=40) for i in range(6)]
    outs = await asyncio.gather(*(finish(s) for s in streams))
    assert engine.preemptions > 0
    for out in outs:
        if out.finish_reason is FinishReason.STOP:
            json.loads(out.text)


async def test_a_grammar_not_compiled_yet_compiles_off_the_loop_then_runs(make_engine):
    engine = await make_engine()
    guided = GuidedDecoding(kind="regex", spec="abc[0-9]")
    assert not engine.grammars.cached(guided)
    out = await finish(submit(engine, guided))
    assert re.fullmatch("abc[0-9]", out.text) and engine.grammars.cached(guided)


async def test_a_refused_grammar_ends_the_stream_with_its_message(make_engine):
    engine = await make_engine()
    out = await finish(submit(engine, GuidedDecoding(kind="json_schema", spec='{"type":"nope"}')))
    assert out.finish_reason is FinishReason.ERROR and "nope" in out.error


async def test_abort_while_compiling_ends_the_stream(make_engine):
    engine = await make_engine()
    stream = submit(engine, GuidedDecoding(kind="regex", spec="x[0-9]+y"))
    engine.abort(stream.request_id)
    out = await finish(stream)
    assert out.finish_reason is FinishReason.ABORT
    assert engine.capacity().free_slots == engine.info.max_batch_size


async def test_requests_without_a_grammar_are_unchanged(make_engine):
    engine = await make_engine()
    alone = await finish(submit(engine, None, ignore_eos=True, max_tokens=20, temperature=0.0))
    free, guided = await asyncio.gather(finish(submit(engine, None, ignore_eos=True, max_tokens=20, temperature=0.0)),
                                        finish(submit(engine)))
    assert free.token_ids == alone.token_ids


async def test_close_while_compiling_ends_the_stream_with_abort(make_engine):
    engine = await make_engine()
    stream = submit(engine, GuidedDecoding(kind="regex", spec="q[0-9]+z"))
    await engine.close()
    out = await finish(stream)
    assert out.finish_reason is FinishReason.ABORT


async def test_a_grammar_not_compiled_yet_compiles_on_the_engines_grammar_worker(make_engine, monkeypatch):
    import threading

    engine = await make_engine()
    threads: list[str] = []
    real = engine.grammars._run_compiler

    def recorded(compiler, guided):
        threads.append(threading.current_thread().name)
        return real(compiler, guided)

    monkeypatch.setattr(engine.grammars, "_run_compiler", recorded)
    out = await finish(submit(engine, GuidedDecoding(kind="regex", spec="w[0-9]")))
    assert re.fullmatch("w[0-9]", out.text)
    assert threads and all(name.startswith("inferd-engine-grammar") for name in threads), threads


async def test_a_grammar_refused_before_ends_with_its_message_without_compiling_again(make_engine):
    engine = await make_engine()
    bad = GuidedDecoding(kind="regex", spec="(")
    first = await finish(submit(engine, bad))
    compiles = engine.grammars.compiles
    second = await finish(submit(engine, bad))
    assert first.finish_reason is second.finish_reason is FinishReason.ERROR and first.error == second.error
    assert engine.grammars.compiles == compiles
