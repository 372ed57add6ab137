"""One behaviour contract, every engine backend (see backends.py for the list)."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from inferd.engine.base import Engine, EngineUnavailable, InvalidRequest
from inferd.engine.stream import RequestStream, merge_deltas
from inferd.types import Delta, FinishReason, GenerationRequest, SamplingParams
from tests.engine.backends import BACKENDS

TIMEOUT_S = 30.0
PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Once upon a time, in a land far away,",
           "Serving many tenants fairly is", "To be or not to be:", "Paged attention keeps KV in blocks",
           "The capital of France is", "def fib(n):", "Roses are red, violets are"]
_ids = itertools.count()


@pytest.fixture(params=sorted(BACKENDS))
async def engine(request: pytest.FixtureRequest):
    async with BACKENDS[request.param](request) as started:
        yield started


def prompt_ids(engine: Engine, i: int = 0) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode(PROMPTS[i % len(PROMPTS)]))


def submit(engine: Engine, prompt: tuple[int, ...], **params) -> RequestStream:
    params.setdefault("ignore_eos", True)
    request = GenerationRequest(request_id=f"conf-{next(_ids)}", prompt_token_ids=prompt,
                                sampling=SamplingParams(**params))
    return engine.submit(request)


async def drain(stream: RequestStream) -> list[Delta]:
    async def read() -> list[Delta]:
        return [d async for d in stream]
    return await asyncio.wait_for(read(), TIMEOUT_S)


async def generate(engine: Engine, prompt: tuple[int, ...], **params) -> tuple[list[Delta], Delta]:
    deltas = await drain(submit(engine, prompt, **params))
    return deltas, merge_deltas(deltas)


async def first_delta(stream: RequestStream) -> Delta:
    return await asyncio.wait_for(stream.__anext__(), TIMEOUT_S)


def idle(engine: Engine) -> tuple[int, int]:
    cap = engine.capacity()
    return cap.free_kv_blocks, cap.free_slots


async def test_idle_capacity_matches_info(engine: Engine) -> None:
    cap, info = engine.capacity(), engine.info
    assert (cap.free_kv_blocks, cap.free_slots, cap.waiting) == (info.num_kv_blocks, info.max_batch_size, 0)
    assert cap.free_kv_tokens == cap.free_kv_blocks * cap.block_size and cap.block_size == info.block_size
    assert info.simulated == (info.backend == "sim")


async def test_stream_deltas_assemble_to_final_text_and_decoded_ids(engine: Engine) -> None:
    deltas, whole = await generate(engine, prompt_ids(engine), max_tokens=12, temperature=0.0)
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert len(whole.token_ids) == 12
    assert "".join(d.text for d in deltas) == whole.text == engine.tokenizer.decode(whole.token_ids)


async def test_final_delta_carries_usage_and_ordered_timing(engine: Engine) -> None:
    prompt = prompt_ids(engine, 1)
    _, whole = await generate(engine, prompt, max_tokens=5, temperature=0.0)
    assert whole.usage is not None and whole.usage.prompt_tokens == len(prompt)
    assert whole.usage.completion_tokens == len(whole.token_ids) == 5
    assert 0 <= whole.usage.cached_tokens < len(prompt)
    t = whole.timing
    assert t is not None and t.submitted <= t.first_scheduled <= t.first_token <= t.finished


async def test_repeated_prompt_reports_cached_tokens_in_whole_blocks(engine: Engine) -> None:
    block_size = engine.info.block_size
    prompt = prompt_ids(engine, 2)
    while len(prompt) <= 2 * block_size:       # several whole blocks, and a partial one
        prompt += prompt_ids(engine, 2)
    _, first = await generate(engine, prompt, max_tokens=2, temperature=0.0)
    _, second = await generate(engine, prompt, max_tokens=2, temperature=0.0)
    assert first.usage.prompt_tokens == second.usage.prompt_tokens == len(prompt)
    # a prefix cache serves whole blocks of the repeat, never the last prompt token
    assert second.usage.cached_tokens % block_size == 0
    assert 0 <= second.usage.cached_tokens < len(prompt)
    if engine.info.prefix_caching:
        assert second.usage.cached_tokens >= 2 * block_size
    else:
        assert second.usage.cached_tokens == 0
    assert first.token_ids == second.token_ids


async def test_max_tokens_ends_with_length(engine: Engine) -> None:
    _, whole = await generate(engine, prompt_ids(engine, 3), max_tokens=7, temperature=0.0)
    assert whole.finish_reason is FinishReason.LENGTH and len(whole.token_ids) == 7


async def test_the_step_loops_cpu_grows_with_the_steps_it_runs_where_the_engine_reports_it(engine: Engine) -> None:
    before = engine.stats().step_cpu_seconds_total
    await generate(engine, prompt_ids(engine, 4), max_tokens=16, temperature=0.0)
    after = engine.stats().step_cpu_seconds_total
    if before is None:                  # trtllm: its executor's threads are its own
        assert after is None
    else:
        assert after > before >= 0.0


async def test_stop_string_ends_generation_and_never_leaks(engine: Engine) -> None:
    prompt = prompt_ids(engine, 4)
    _, free_run = await generate(engine, prompt, max_tokens=24, temperature=0.0)
    text = free_run.text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert len(stop) == 3, f"greedy run too short to derive a stop string: {text!r}"
    deltas, stopped = await generate(engine, prompt, max_tokens=24, temperature=0.0, stop=(stop,))
    assert stopped.finish_reason is FinishReason.STOP
    assert stopped.text == text[:text.index(stop)]
    assert all(stop not in d.text for d in deltas)
    assert stopped.token_ids == free_run.token_ids[:len(stopped.token_ids)]


async def test_stop_token_id_ends_generation(engine: Engine) -> None:
    prompt = prompt_ids(engine, 5)
    _, free_run = await generate(engine, prompt, max_tokens=16, temperature=0.0)
    stop_id = free_run.token_ids[5]
    cut = free_run.token_ids.index(stop_id) + 1
    _, stopped = await generate(engine, prompt, max_tokens=16, temperature=0.0, stop_token_ids=(stop_id,))
    assert stopped.finish_reason is FinishReason.STOP
    assert stopped.token_ids == free_run.token_ids[:cut]


async def test_greedy_output_is_reproducible(engine: Engine) -> None:
    prompt = prompt_ids(engine, 6)
    runs = [await generate(engine, prompt, max_tokens=10, temperature=0.0) for _ in range(2)]
    assert runs[0][1].token_ids == runs[1][1].token_ids


async def test_seeded_sampling_is_reproducible_whatever_else_is_batched(engine: Engine) -> None:
    prompt = prompt_ids(engine, 7)
    _, alone = await generate(engine, prompt, max_tokens=10, temperature=1.0, seed=1234)
    others = [submit(engine, prompt_ids(engine, i), max_tokens=10, temperature=1.0) for i in range(2)]
    _, batched = await generate(engine, prompt, max_tokens=10, temperature=1.0, seed=1234)
    await asyncio.gather(*(drain(s) for s in others))
    assert alone.token_ids == batched.token_ids


async def test_any_signed_64_bit_seed_is_taken_modulo_2_64(engine: Engine) -> None:
    # the API accepts OpenAI's signed seeds; generators take unsigned 64-bit ones
    prompt = prompt_ids(engine, 3)
    _, negative = await generate(engine, prompt, max_tokens=8, temperature=1.0, seed=-1)
    _, image = await generate(engine, prompt, max_tokens=8, temperature=1.0, seed=2 ** 64 - 1)
    assert negative.finish_reason is FinishReason.LENGTH and negative.token_ids == image.token_ids
    assert engine.healthy


async def test_abort_ends_stream_with_abort_and_frees_capacity(engine: Engine) -> None:
    at_idle = idle(engine)
    stream = submit(engine, prompt_ids(engine), max_tokens=200, temperature=0.0)
    await first_delta(stream)
    engine.abort(stream.request_id)
    rest = await drain(stream)
    assert rest[-1].finish_reason is FinishReason.ABORT and rest[-1].usage is not None
    assert idle(engine) == at_idle
    engine.abort(stream.request_id)        # finished ids are ignored
    engine.abort("never-submitted")


async def test_a_yielded_slot_is_free_at_once_and_the_stream_resumes_with_nothing_lost(engine: Engine) -> None:
    at_idle = idle(engine)
    prompt = prompt_ids(engine, 2)
    n = min(600, engine.info.max_model_len - len(prompt))     # long: still running when asked to yield
    _, alone = await generate(engine, prompt, max_tokens=n, temperature=0.0)
    stream = submit(engine, prompt, max_tokens=n, temperature=0.0)
    head = await first_delta(stream)
    free = engine.capacity().free_slots
    if not engine.yields_slots:                 # trtllm: its executor cannot preempt (admission keeps a reserve)
        assert not engine.yield_slot(stream.request_id)
        engine.abort(stream.request_id)
        await drain(stream)
        return
    assert engine.yield_slot(stream.request_id)
    cap = engine.capacity()
    assert cap.free_slots == free + 1 and cap.parked == 1
    whole = merge_deltas([head, *await drain(stream)])
    assert whole.token_ids == alone.token_ids and whole.finish_reason is FinishReason.LENGTH
    assert engine.stats().fairness_preemptions_total == 1 and idle(engine) == at_idle
    assert not engine.yield_slot(stream.request_id)     # finished: nothing to yield


async def test_stream_cancel_aborts_the_request(engine: Engine) -> None:
    at_idle = idle(engine)
    stream = submit(engine, prompt_ids(engine, 1), max_tokens=200, temperature=0.0)
    await first_delta(stream)
    stream.cancel()
    rest = await drain(stream)
    assert rest[-1].finish_reason is FinishReason.ABORT
    assert idle(engine) == at_idle


async def test_invalid_request_names_its_param_and_leaves_others_running(engine: Engine) -> None:
    at_idle = idle(engine)
    prompt = prompt_ids(engine)
    running = submit(engine, prompt, max_tokens=20, temperature=0.0)
    first = await first_delta(running)      # on a busy machine it may already hold all 20 tokens and the end
    with pytest.raises(InvalidRequest) as too_long:
        submit(engine, prompt, max_tokens=engine.info.max_model_len)
    assert too_long.value.param == "max_tokens"
    with pytest.raises(InvalidRequest) as empty:
        submit(engine, (), max_tokens=4)
    assert empty.value.param == "prompt"
    with pytest.raises(InvalidRequest) as zero:
        submit(engine, prompt, max_tokens=0)
    assert zero.value.param == "max_tokens"
    final = merge_deltas([first, *await drain(running)])
    assert final.finish_reason is FinishReason.LENGTH and final.usage.completion_tokens == 20
    assert idle(engine) == at_idle


@pytest.mark.parametrize(("params", "field"), [
    (dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_k=-1), "top_k"),
    (dict(stop=("",)), "stop"), (dict(stop_token_ids=(10 ** 9,)), "stop_token_ids"),
    (dict(presence_penalty=3.0), "presence_penalty"), (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(min_p=2.0), "min_p"), (dict(logit_bias=((10 ** 9, 1.0),)), "logit_bias"),
])
async def test_bad_sampling_fields_are_rejected_naming_them(engine: Engine, params: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        submit(engine, prompt_ids(engine), max_tokens=2, **params)
    assert info.value.param == field
    assert idle(engine) == (engine.info.num_kv_blocks, engine.info.max_batch_size)


async def test_every_backend_states_the_context_limit_alike(engine: Engine) -> None:
    prompt, limit = prompt_ids(engine), engine.info.max_model_len
    with pytest.raises(InvalidRequest) as info:
        submit(engine, prompt, max_tokens=limit - len(prompt) + 1)
    assert info.value.param == "max_tokens"
    assert str(info.value) == (f"this model's maximum context length is {limit} tokens; the request needs "
                               f"{limit + 1} ({len(prompt)} prompt + {limit - len(prompt) + 1} max_tokens)")
    with pytest.raises(InvalidRequest) as info:
        submit(engine, (*prompt[:-1], 10 ** 9), max_tokens=2)
    assert info.value.param == "prompt"


async def test_capacity_goes_down_while_requests_run_and_back_up_after(engine: Engine) -> None:
    at_idle = idle(engine)
    n = min(3, engine.info.max_batch_size)
    prompts = [prompt_ids(engine, i) for i in range(n)]
    # long enough that none can finish while the test looks (a fast backend on a busy machine can run
    # dozens of steps between two of the test's turns); aborted below
    streams = [submit(engine, p, max_tokens=200, temperature=0.0) for p in prompts]
    prompt_blocks = sum(-(-len(p) // engine.info.block_size) for p in prompts)
    # submitted but not yet scheduled work counts too: capacity never over-reports
    for _ in range(2):
        free_blocks, free_slots = idle(engine)
        assert free_slots == at_idle[1] - n
        assert free_blocks <= at_idle[0] - prompt_blocks
        await asyncio.gather(*(first_delta(s) for s in streams))
    assert engine.stats().running + engine.stats().waiting == n
    for stream in streams:
        engine.abort(stream.request_id)
    await asyncio.gather(*(drain(s) for s in streams))
    assert idle(engine) == at_idle
    assert engine.stats().running == engine.stats().waiting == 0


async def test_pending_prefill_counts_submitted_prompts_until_their_first_token(engine: Engine) -> None:
    assert engine.capacity().pending_prefill_tokens == 0
    n = min(3, engine.info.max_batch_size)
    prompts = [prompt_ids(engine, i) * 2 for i in range(n)]
    streams, submitted = [], 0
    for p in prompts:
        before = engine.capacity().pending_prefill_tokens
        streams.append(submit(engine, p, max_tokens=30, temperature=0.0))
        submitted += len(p)
        pending = engine.capacity().pending_prefill_tokens
        # a submitted prompt is pending until computed; a threaded engine may have run a step since
        assert 0 < pending <= submitted and pending >= before + len(p) - engine.info.max_num_tokens
    await asyncio.gather(*(first_delta(s) for s in streams))
    assert engine.capacity().pending_prefill_tokens == 0      # all decoding now
    await asyncio.gather(*(drain(s) for s in streams))
    assert engine.capacity().pending_prefill_tokens == 0


async def test_more_concurrent_requests_than_slots_all_finish(engine: Engine) -> None:
    n = 2 * engine.info.max_batch_size + 1
    prompts = [prompt_ids(engine, i) + prompt_ids(engine, i + 1) for i in range(n)]
    streams = [submit(engine, p, max_tokens=6, temperature=0.0) for p in prompts]
    results = [merge_deltas(d) for d in await asyncio.gather(*(drain(s) for s in streams))]
    assert [r.finish_reason for r in results] == [FinishReason.LENGTH] * n
    assert [r.usage.prompt_tokens for r in results] == [len(p) for p in prompts]
    assert all(len(r.token_ids) == 6 for r in results)


async def test_close_ends_in_flight_streams_with_abort(engine: Engine) -> None:
    streams = [submit(engine, prompt_ids(engine, i), max_tokens=200, temperature=0.0) for i in range(2)]
    await asyncio.gather(*(first_delta(s) for s in streams))
    await asyncio.wait_for(engine.close(), TIMEOUT_S)
    for stream in streams:
        rest = await drain(stream)
        assert rest[-1].finish_reason is FinishReason.ABORT
    with pytest.raises(EngineUnavailable):
        submit(engine, prompt_ids(engine), max_tokens=2)
