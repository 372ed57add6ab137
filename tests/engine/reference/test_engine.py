"""ReferenceEngine end to end on the tiny synthetic artifact (loads in milliseconds)."""
from __future__ import annotations

import asyncio
import shutil
import threading

import pytest

from inferd.artifacts.manifest import ArtifactError
from inferd.engine.base import EngineUnavailable, InvalidRequest
from inferd.engine.reference.engine import ReferenceEngine
from inferd.engine.validation import failure_message
from inferd.types import FinishReason, GenerationRequest, SamplingParams
from tests.engine.backends import json_log, started_engines

ENGINE_LOGGER = "inferd.engine.step_engine"

TEXTS = [
    "the quick brown fox",
    "one of the most common words in the language is the",
    "we said",
    "there was a time when all of them were at home and they could not be found by the",
    "how",
    "what do you think about this and that",
]


@pytest.fixture
async def make_engine(tiny_artifact):
    def build(**kwargs) -> ReferenceEngine:
        kwargs.setdefault("num_kv_blocks", 256)
        kwargs.setdefault("block_size", 4)
        return ReferenceEngine(tiny_artifact, **kwargs)

    async with started_engines(build) as make:
        yield make


def req(engine, rid, text, max_tokens=12, tenant="t", **sampling) -> GenerationRequest:
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("ignore_eos", True)
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode(text)),
                             sampling=SamplingParams(max_tokens=max_tokens, **sampling), tenant=tenant)


async def solo(engine, request: GenerationRequest):
    return await engine.submit(request).collect()


async def test_batched_greedy_outputs_equal_solo_outputs(make_engine):
    engine = await make_engine(max_num_tokens=16)      # small budget: prefill chunks mix with decodes
    lengths = [20, 7, 15, 24, 9, 12]
    expected = [(await solo(engine, req(engine, f"solo{i}", t, n, tenant=f"solo{i}"))).token_ids
                for i, (t, n) in enumerate(zip(TEXTS, lengths))]
    first = [engine.submit(req(engine, f"b{i}", TEXTS[i], lengths[i], tenant=f"b{i}")) for i in range(3)]
    head = await first[0].__anext__()                   # the others join a batch already decoding
    rest = [engine.submit(req(engine, f"b{i}", TEXTS[i], lengths[i], tenant=f"b{i}")) for i in range(3, 6)]
    outputs = await asyncio.gather(*(s.collect() for s in first[1:] + rest))
    first_out = await first[0].collect()
    got = [None] * 6
    got[0] = head.token_ids + first_out.token_ids
    for i, out in zip(range(1, 6), outputs):
        got[i] = out.token_ids
    assert got == expected
    assert all(len(t) == n for t, n in zip(got, lengths))


async def test_seeded_sampling_is_reproducible_under_batching(make_engine):
    engine = await make_engine()
    seeded = dict(temperature=1.0, top_p=0.95, seed=42)
    alone = await solo(engine, req(engine, "alone", TEXTS[1], 16, **seeded))
    others = [engine.submit(req(engine, f"o{i}", TEXTS[i], 16, temperature=1.2)) for i in (0, 2, 3)]
    batched = engine.submit(req(engine, "batched", TEXTS[1], 16, **seeded))
    results = await asyncio.gather(batched.collect(), *(s.collect() for s in others))
    assert results[0].token_ids == alone.token_ids
    unseeded = [await solo(engine, req(engine, f"u{i}", TEXTS[1], 16, temperature=1.0)) for i in range(2)]
    assert unseeded[0].token_ids != unseeded[1].token_ids


async def test_stop_string_never_leaks_and_the_text_ends_before_it(make_engine):
    engine = await make_engine()
    full = await solo(engine, req(engine, "full", TEXTS[0], 40))
    text = full.text
    start = next(i for i in range(4, len(text) - 3) if "\ufffd" not in text[i:i + 3] and text[i:i + 3].strip())
    stop = text[start:start + 3]
    stream = engine.submit(req(engine, "stopped", TEXTS[0], 40, stop=("zzzz-never", stop)))
    pieces = []
    async for delta in stream:
        pieces.append(delta)
    streamed = "".join(d.text for d in pieces)
    assert streamed == text[:text.find(stop)]
    assert all(stop not in d.text for d in pieces)
    assert pieces[-1].finish_reason is FinishReason.STOP
    assert pieces[-1].usage.completion_tokens < 40


async def test_stop_token_ends_with_stop_and_max_tokens_with_length(make_engine):
    engine = await make_engine()
    full = await solo(engine, req(engine, "full", TEXTS[2], 10))
    assert full.finish_reason is FinishReason.LENGTH and full.usage.completion_tokens == 10
    stop_id = full.token_ids[3]
    cut = full.token_ids.index(stop_id) + 1
    stopped = await solo(engine, req(engine, "stopped", TEXTS[2], 10, stop_token_ids=(stop_id,)))
    assert stopped.finish_reason is FinishReason.STOP and stopped.token_ids == full.token_ids[:cut]


async def test_abort_frees_blocks_within_one_step(make_engine):
    engine = await make_engine(num_kv_blocks=64)
    idle = engine.capacity()
    stream = engine.submit(req(engine, "long", TEXTS[3], 200))
    await stream.__anext__()
    busy = engine.capacity()
    assert busy.free_kv_blocks < idle.free_kv_blocks and busy.free_slots == idle.free_slots - 1
    engine.abort("long")
    rest = [d async for d in stream]
    assert rest[-1].finish_reason is FinishReason.ABORT
    assert rest[-1].usage.completion_tokens < 200
    assert engine.capacity() == idle
    assert engine.stats().kv_blocks_used == 0


async def test_stream_cancel_aborts_the_request(make_engine):
    engine = await make_engine()
    stream = engine.submit(req(engine, "gone", TEXTS[3], 200))
    await stream.__anext__()
    stream.cancel()
    final = [d async for d in stream][-1]
    assert final.finish_reason is FinishReason.ABORT and engine.stats().running == 0


async def test_repeated_prompt_hits_the_prefix_cache(make_engine):
    engine = await make_engine()
    text = TEXTS[3]
    prompt_len = len(engine.tokenizer.encode(text))
    first = await solo(engine, req(engine, "a", text))
    second = await solo(engine, req(engine, "b", text))
    other_tenant = await solo(engine, req(engine, "c", text, tenant="someone-else"))
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens == (prompt_len - 1) // 4 * 4 > 0
    assert other_tenant.usage.cached_tokens == 0
    assert second.token_ids == first.token_ids == other_tenant.token_ids
    stats = engine.stats()
    assert stats.prefix_cache_hit_tokens_total == second.usage.cached_tokens
    assert stats.prefix_cache_hit_rate == pytest.approx(second.usage.cached_tokens / (3 * prompt_len))


async def test_small_kv_pool_forces_preemption_yet_yields_solo_outputs(make_engine):
    roomy = await make_engine()
    expected = [(await solo(roomy, req(roomy, f"s{i}", t, 24, tenant=f"s{i}"))).token_ids
                for i, t in enumerate(TEXTS)]
    tight = await make_engine(num_kv_blocks=20)        # each request needs up to 11 blocks of 4
    streams = [tight.submit(req(tight, f"p{i}", t, 24, tenant=f"p{i}")) for i, t in enumerate(TEXTS)]
    outputs = await asyncio.gather(*(s.collect() for s in streams))
    assert tight.num_preemptions > 0
    assert [o.token_ids for o in outputs] == expected
    assert tight.capacity().free_kv_blocks == 20


async def test_final_delta_carries_usage_and_ordered_timing(make_engine):
    engine = await make_engine()
    steps: list[float] = []
    engine.step_observer = steps.append
    out = await solo(engine, req(engine, "t", TEXTS[1], 5))
    prompt_len = len(engine.tokenizer.encode(TEXTS[1]))
    assert out.usage.prompt_tokens == prompt_len and out.usage.completion_tokens == 5
    t = out.timing
    assert t.submitted <= t.first_scheduled <= t.first_token <= t.finished
    stats = engine.stats()
    assert stats.generation_tokens_total == 5 and stats.prompt_tokens_total == prompt_len
    assert stats.steps_total >= 5 and stats.step_latency_s > 0 and stats.tokens_per_s > 0
    assert len(steps) == stats.steps_total and all(s > 0 for s in steps)


async def test_submit_rejects_bad_requests_naming_the_field(make_engine):
    engine = await make_engine()
    limit = engine.info.max_model_len
    cases = {
        "prompt": GenerationRequest(request_id="e", prompt_token_ids=(), sampling=SamplingParams()),
        "max_tokens": GenerationRequest(request_id="m", prompt_token_ids=(1, 2),
                                        sampling=SamplingParams(max_tokens=limit)),
        "top_p": GenerationRequest(request_id="p", prompt_token_ids=(1,), sampling=SamplingParams(top_p=0.0)),
        "temperature": GenerationRequest(request_id="t", prompt_token_ids=(1,),
                                         sampling=SamplingParams(temperature=-1.0)),
    }
    for param, bad in cases.items():
        with pytest.raises(InvalidRequest) as info:
            engine.submit(bad)
        assert info.value.param == param
    with pytest.raises(InvalidRequest) as info:
        engine.submit(GenerationRequest(request_id="v", prompt_token_ids=(1, 10**6), sampling=SamplingParams()))
    assert info.value.param == "prompt"
    stream = engine.submit(req(engine, "dup", TEXTS[0], 50))
    with pytest.raises(InvalidRequest) as info:
        engine.submit(req(engine, "dup", TEXTS[0]))
    assert info.value.param == "request_id"
    await stream.collect()
    await solo(engine, req(engine, "dup", TEXTS[0], 2))     # a finished id may be used again


async def test_capacity_counts_requests_the_step_thread_has_not_taken(make_engine):
    engine = await make_engine(max_batch_size=8, num_kv_blocks=64)
    idle = engine.capacity()
    entered, release = threading.Event(), threading.Event()
    forward = engine.model.forward

    def blocking_forward(batch, kv):
        entered.set()
        release.wait(10)
        return forward(batch, kv)

    engine.model.forward = blocking_forward
    first = engine.submit(req(engine, "first", TEXTS[0], 3))
    try:
        await asyncio.to_thread(entered.wait, 10)       # the step thread is inside a step
        queued = [engine.submit(req(engine, f"q{i}", TEXTS[3], 3)) for i in range(2)]
        cap = engine.capacity()
    finally:
        release.set()
    prompt_blocks = -(-len(engine.tokenizer.encode(TEXTS[3])) // 4)
    # "first" is taken but no snapshot since counts it; the queued two are not taken at all
    assert cap.waiting >= 2 and cap.free_slots == idle.free_slots - 3
    assert cap.free_kv_blocks <= idle.free_kv_blocks - 2 * prompt_blocks
    await asyncio.gather(first.collect(), *(s.collect() for s in queued))
    assert engine.capacity() == idle


async def test_a_failing_step_fails_its_requests_and_the_engine_carries_on(make_engine):
    engine = await make_engine()
    forward = engine.model.forward
    calls = []

    def failing_once(batch, kv):
        calls.append(1)
        if len(calls) == 1:
            raise FloatingPointError("boom")
        return forward(batch, kv)

    engine.model.forward = failing_once
    with json_log(ENGINE_LOGGER) as lines:
        failed = await solo(engine, req(engine, "bad", TEXTS[0], 4))
    # the client learns which request to look up, never the exception; the log has it
    assert failed.finish_reason is FinishReason.ERROR and failed.error == failure_message("bad")
    assert any(line["exc"] == "boom" and "bad" in line["request_ids"] for line in lines)
    assert engine.healthy and engine.stats().kv_blocks_used == 0
    ok = await solo(engine, req(engine, "good", TEXTS[0], 4))
    assert ok.finish_reason is FinishReason.LENGTH


async def test_a_dead_step_thread_fails_requests_and_turns_unhealthy(make_engine):
    engine = await make_engine()

    def broken_schedule():
        raise RuntimeError("scheduler bug")

    engine._scheduler.schedule = broken_schedule
    with json_log(ENGINE_LOGGER) as lines:
        out = await solo(engine, req(engine, "x", TEXTS[0], 4))
        await asyncio.to_thread(engine._thread.join, 10)
    assert out.finish_reason is FinishReason.ERROR and out.error == failure_message("x")
    assert any(line["exc"] == "scheduler bug" and "x" in line["request_ids"] for line in lines)
    assert not engine.healthy
    with pytest.raises(EngineUnavailable) as unavailable:
        engine.submit(req(engine, "y", TEXTS[0]))
    assert "scheduler bug" not in str(unavailable.value)


async def test_close_aborts_everything_in_flight(tiny_artifact):
    engine = ReferenceEngine(tiny_artifact, num_kv_blocks=128, block_size=4)
    await engine.start()
    await engine.warmup()
    streams = [engine.submit(req(engine, f"c{i}", TEXTS[i], 300)) for i in range(3)]
    await streams[0].__anext__()
    await engine.close()
    finals = []
    for s in streams:   # not one comprehension: async inside a sync comprehension needs 3.11
        finals.append([d async for d in s][-1])
    assert all(f.finish_reason is FinishReason.ABORT for f in finals)
    assert not engine.healthy
    with pytest.raises(EngineUnavailable):
        engine.submit(req(engine, "late", TEXTS[0]))


async def test_start_refuses_an_altered_artifact(tiny_artifact, tmp_path):
    copy = tmp_path / "tiny"
    shutil.copytree(tiny_artifact, copy)
    with (copy / "config.json").open("a") as f:
        f.write(" ")
    engine = ReferenceEngine(copy, num_kv_blocks=16)
    with pytest.raises(ArtifactError) as info:
        await engine.start()
    assert info.value.file == "config.json"
    assert not engine.healthy
    with pytest.raises(EngineUnavailable):
        engine.submit(GenerationRequest(request_id="x", prompt_token_ids=(1,), sampling=SamplingParams()))


async def test_a_negative_seed_samples_like_its_64_bit_image_and_the_engine_stays_healthy(make_engine):
    engine = await make_engine()
    runs = [await asyncio.wait_for(solo(engine, req(engine, f"s{seed}", TEXTS[1], 8, temperature=1.0, seed=seed)),
                                   10) for seed in (-1, 2 ** 64 - 1)]
    assert [r.finish_reason for r in runs] == [FinishReason.LENGTH] * 2
    assert runs[0].token_ids == runs[1].token_ids
    assert engine.healthy


async def test_a_request_that_cannot_be_set_up_fails_alone(make_engine, monkeypatch):
    import inferd.engine.reference.admission as engine_module    # where a request is set up
    engine = await make_engine()
    make_rng = engine_module.make_rng

    def picky_rng(seed):
        if seed == 666:
            raise ValueError("secret detail")
        return make_rng(seed)

    monkeypatch.setattr(engine_module, "make_rng", picky_rng)
    with engine._cond:       # both requests reach the step thread in one batch of commands
        bad = engine.submit(req(engine, "bad", TEXTS[0], 4, temperature=1.0, seed=666))
        good = engine.submit(req(engine, "good", TEXTS[0], 4, temperature=1.0, seed=7))
    with json_log(ENGINE_LOGGER) as lines:
        failed, ok = await asyncio.wait_for(asyncio.gather(bad.collect(), good.collect()), 10)
    assert failed.finish_reason is FinishReason.ERROR and failed.error == failure_message("bad")
    assert any(line.get("request_id") == "bad" and line["exc"] == "secret detail" for line in lines)
    assert ok.finish_reason is FinishReason.LENGTH and len(ok.token_ids) == 4
    assert engine.healthy


async def test_a_dead_step_thread_ends_every_stream_it_had_taken(make_engine):
    engine = await make_engine()

    def broken_add(seq):
        raise RuntimeError("scheduler bug")

    engine._scheduler.add = broken_add
    with engine._cond:       # the thread takes all three in one batch and dies on the first
        streams = [engine.submit(req(engine, f"t{i}", TEXTS[i], 4)) for i in range(3)]
    finals = await asyncio.wait_for(asyncio.gather(*(s.collect() for s in streams)), 10)
    assert [f.finish_reason for f in finals] == [FinishReason.ERROR] * 3
    await asyncio.to_thread(engine._thread.join, 10)
    assert not engine.healthy


async def test_max_model_len_is_bounded_by_the_kv_pool(make_engine):
    engine = await make_engine(num_kv_blocks=8, block_size=4)     # 32 tokens of KV, far below the model's context
    await engine.warmup()
    assert engine.info.max_model_len == 32 < engine.model.config.max_position_embeddings
    prompt_len = len(engine.tokenizer.encode(TEXTS[0]))
    # what the API defaults max_tokens to (the rest of max_model_len) runs
    out = await solo(engine, req(engine, "fits", TEXTS[0], 32 - prompt_len))
    assert out.finish_reason is FinishReason.LENGTH and out.usage.completion_tokens == 32 - prompt_len
    with pytest.raises(InvalidRequest) as info:
        engine.submit(req(engine, "over", TEXTS[0], 33 - prompt_len))
    assert info.value.param == "max_tokens" and "32" in str(info.value)


async def test_a_yielded_sequence_pauses_and_resumes_with_the_output_of_an_unpreempted_run(make_engine):
    engine = await make_engine(max_batch_size=1)
    expected = (await solo(engine, req(engine, "solo", TEXTS[3], 80))).token_ids
    hog = engine.submit(req(engine, "hog", TEXTS[3], 80))   # long: still running when it is asked to yield
    head = await hog.__anext__()
    assert engine.yield_slot("hog")
    assert engine.capacity().free_slots == 1            # at once, before the step thread parks it
    newcomer = await solo(engine, req(engine, "new", TEXTS[1], 4, tenant="other"))
    rest = await hog.collect()
    assert newcomer.timing.finished < rest.timing.finished   # it ran in the one slot while the hog waited
    assert head.token_ids + rest.token_ids == expected  # recomputed from its tokens so far: nothing lost
    assert engine.stats().fairness_preemptions_total == 1 and engine.capacity().parked == 0
