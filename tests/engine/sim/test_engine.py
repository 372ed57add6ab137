"""Behaviour specific to the simulated engine: roofline timing, capacity limits, synthetic tokens.

What every engine must do is in test_conformance.py; this file covers what only the sim does.
"""
from __future__ import annotations

import asyncio
import gc
import itertools
import time

import msgspec
import pytest

from inferd.engine.base import EngineUnavailable
from inferd.engine.sim.engine import SimEngine
from inferd.engine.sim.profiles import LOAD_SETUP_S, PROFILES, SimTokenizer, get_profile
from inferd.engine.stream import merge_deltas
from inferd.engine.validation import failure_message
from inferd.types import Delta, FinishReason, GenerationRequest, SamplingParams
from tests.engine.backends import json_log, started_engines

GiB = 1024 ** 3
_ids = itertools.count()


@pytest.fixture
async def make_engine():
    def build(profile="tiny", **kwargs) -> SimEngine:
        kwargs.setdefault("time_scale", 0.0)
        return SimEngine(profile, **kwargs)

    async with started_engines(build) as make:
        yield make


def submit(engine: SimEngine, prompt, **params):
    params.setdefault("ignore_eos", True)
    params.setdefault("temperature", 0.0)
    return engine.submit(GenerationRequest(request_id=f"sim-{next(_ids)}", prompt_token_ids=tuple(prompt),
                                           sampling=SamplingParams(**params)))


async def finish(stream) -> Delta:
    return await asyncio.wait_for(stream.collect(), 30)


def prompt(n: int, salt: int = 0) -> tuple[int, ...]:
    return tuple(300 + (salt * 31 + k) % 3000 for k in range(n))


# -- profiles and the roofline -------------------------------------------------------------------

def test_kv_pool_is_sized_from_hbm_left_after_weights() -> None:
    kv_bytes_per_block = 2 * 32 * 8 * 128 * 2 * 16          # K+V x layers x kv heads x head dim x bf16 x tokens
    expected = int((80 * GiB - 8.03e9 * 2 - 3 * GiB) * 0.9 // kv_bytes_per_block)
    assert SimEngine("llama3-8b-h100").info.num_kv_blocks == expected
    assert SimEngine("llama3-8b-h100", num_kv_blocks=100).info.num_kv_blocks == 100
    # fp8 halves weights and KV entries: more than twice the blocks
    assert SimEngine("llama3-8b-h100-fp8").info.num_kv_blocks > 2 * expected


def test_llama3_8b_bf16_decode_steps_match_published_latency() -> None:
    profile = PROFILES["llama3-8b-h100"]
    assert 5e-3 <= profile.decode_step_time(1, 512) <= 7e-3       # ~150 tok/s for a single stream
    assert 6e-3 <= profile.decode_step_time(64, 512) <= 8e-3


def test_load_time_is_the_weights_on_one_gpu_over_the_load_bandwidth_plus_a_fixed_setup() -> None:
    profile = PROFILES["llama3-8b-h100"]
    assert profile.load_time_s() == pytest.approx(8.03e9 * 2 / 2.0e9 + LOAD_SETUP_S)   # ~8.5 s from an NVMe
    faster = msgspec.structs.replace(profile, load_bandwidth=4.0e9)
    assert faster.load_time_s() - LOAD_SETUP_S == pytest.approx((profile.load_time_s() - LOAD_SETUP_S) / 2)
    # fp8 halves the bytes to read; with tensor parallelism each GPU reads only its shard
    assert PROFILES["llama3-8b-h100-fp8"].load_time_s() == pytest.approx(8.03e9 / 2.0e9 + LOAD_SETUP_S)
    assert PROFILES["llama3-70b-4xh100"].load_time_s() == pytest.approx(70.6e9 * 2 / 4 / 2.0e9 + LOAD_SETUP_S)
    for p in PROFILES.values():
        assert p.load_time_s() > LOAD_SETUP_S


def test_load_bandwidth_changes_no_step_timing_or_kv_pool() -> None:
    for profile in PROFILES.values():
        slow_disk = msgspec.structs.replace(profile, load_bandwidth=1.0)
        assert slow_disk.decode_step_time(8, 512) == profile.decode_step_time(8, 512)
        assert slow_disk.step_time(2048, 2048, 2048 * 1024) == profile.step_time(2048, 2048, 2048 * 1024)
        assert slow_disk.num_kv_blocks(16) == profile.num_kv_blocks(16)


@pytest.mark.slow
@pytest.mark.parametrize(("profile", "isl", "osl", "requests", "published"), [
    ("llama3-8b-h100-fp8", 128, 128, 768, 28_312),     # TensorRT-LLM perf overview, H100 TP1 FP8
    ("llama3-8b-h100-fp8", 2048, 128, 256, 3_450),
])
async def test_max_load_throughput_matches_published_figure(make_engine, profile, isl, osl, requests,
                                                            published) -> None:
    engine = await make_engine(profile, max_batch_size=256, max_num_tokens=8192)
    streams = [submit(engine, prompt(isl, i), max_tokens=osl) for i in range(requests)]
    outputs = await asyncio.gather(*(finish(s) for s in streams))
    rate = sum(len(d.token_ids) for d in outputs) / engine.sim_time
    assert published * 0.85 <= rate <= published * 1.15


async def test_decode_step_time_follows_the_roofline_with_batch_size(make_engine) -> None:
    profile = PROFILES["tiny"]
    step_times = {}
    for batch in (1, 64):
        engine = await make_engine(max_batch_size=64, max_num_tokens=4096, num_kv_blocks=1024)
        steps: list[float] = []
        engine.step_observer = steps.append
        streams = [submit(engine, prompt(32, i), max_tokens=9) for i in range(batch)]
        await asyncio.gather(*(finish(s) for s in streams))
        assert len(steps) == 9               # one prefill step (all prompts fit the budget), 8 decode steps
        step_times[batch] = sum(steps[1:]) / 8
    implied = profile.decode_step_time(64, 36) / profile.decode_step_time(1, 36)
    assert implied > 2   # the tiny profile is compute-bound at batch 64
    assert step_times[64] / step_times[1] == pytest.approx(implied, rel=0.05)


@pytest.mark.bench        # timed: `pytest -m bench`, not the default run
async def test_wall_clock_follows_simulated_time_times_time_scale(make_engine) -> None:
    engine = await make_engine(time_scale=2.0)
    start = time.monotonic()
    await finish(submit(engine, prompt(16), max_tokens=20))
    elapsed = time.monotonic() - start
    assert engine.sim_time * 2.0 * 0.9 <= elapsed <= engine.sim_time * 2.0 + 0.5


@pytest.mark.bench        # timed: `pytest -m bench`, not the default run
async def test_time_scale_zero_runs_without_waiting_for_simulated_time(make_engine) -> None:
    engine = await make_engine("llama3-70b-4xh100")
    start = time.monotonic()
    await finish(submit(engine, prompt(16), max_tokens=50))
    assert engine.sim_time > 0.6          # 50 steps of a 70B model on TP4
    assert time.monotonic() - start < 0.1 * engine.sim_time


@pytest.mark.bench        # timed: `pytest -m bench`, not the default run
async def test_step_of_256_running_sequences_costs_a_few_milliseconds_at_most(make_engine) -> None:
    engine = await make_engine("llama3-8b-h100", max_batch_size=256)
    streams = [submit(engine, prompt(8, i), max_tokens=60) for i in range(256)]
    await streams[-1].__anext__()          # all 256 prefilled together in the first step
    # The other streams' deltas pile up unread (this test measures the engine, not consumers); keep the
    # collector from walking that pile, which a daemon that reads its streams never builds.
    gc.disable()
    try:
        steps, cpu = engine.stats().steps_total, time.process_time()
        await finish(streams[-1])          # the others finish in the same step
        per_step = (time.process_time() - cpu) / (engine.stats().steps_total - steps)
    finally:
        gc.enable()
    assert all(s.finished for s in streams)
    # ~0.4 ms on 3.11 here. Performance targets are checked by bench/frontend.py, not timed tests: this
    # bound only catches a gross regression (per-sequence work going quadratic) on any loaded machine.
    assert per_step < 5e-3


# -- scheduling and capacity ---------------------------------------------------------------------

async def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget(make_engine) -> None:
    engine = await make_engine(max_num_tokens=32)
    stream = submit(engine, prompt(100), max_tokens=3)
    await finish(stream)
    assert engine.stats().steps_total == 4 + 2      # ceil(100 / 32) prefill steps, then 2 decode steps


async def test_max_batch_size_bounds_running_sequences_and_queues_the_rest(make_engine) -> None:
    engine = await make_engine(max_batch_size=2, time_scale=0.01)
    streams = [submit(engine, prompt(8, i), max_tokens=10) for i in range(5)]
    observed = []
    async def watch(stream):
        async for _ in stream:
            observed.append((engine.stats().running, engine.stats().waiting))
    await asyncio.wait_for(asyncio.gather(*(watch(s) for s in streams)), 30)
    assert max(r for r, _ in observed) == 2
    assert max(w for _, w in observed) >= 1


async def test_running_out_of_blocks_preempts_the_newest_instead_of_failing(make_engine) -> None:
    solo = await make_engine(num_kv_blocks=64)
    expected = [(await finish(submit(solo, prompt(16, i), max_tokens=48))).token_ids for i in range(3)]
    # 3 sequences grow to 4 blocks each; 8 blocks cannot hold them all at once
    tight = await make_engine(num_kv_blocks=8)
    outputs = await asyncio.gather(*(finish(submit(tight, prompt(16, i), max_tokens=48)) for i in range(3)))
    assert tight.preemptions > 0
    assert [o.finish_reason for o in outputs] == [FinishReason.LENGTH] * 3
    assert [o.token_ids for o in outputs] == expected       # recomputed, not resampled
    assert tight.capacity().free_kv_blocks == 8


async def test_waiting_requests_reserve_their_prompt_blocks(make_engine) -> None:
    engine = await make_engine(num_kv_blocks=20, block_size=16)
    submit(engine, prompt(40), max_tokens=4)        # 3 blocks once scheduled
    cap = engine.capacity()
    assert (cap.free_kv_blocks, cap.waiting, cap.free_slots) == (17, 1, engine.info.max_batch_size - 1)


def test_max_model_len_is_bounded_by_the_kv_pool() -> None:
    # the API defaults max_tokens to the rest of max_model_len: it must be a context the pool can hold
    assert SimEngine("tiny", num_kv_blocks=4, block_size=16, max_model_len=256).info.max_model_len == 64
    assert SimEngine("tiny", num_kv_blocks=40, block_size=16, max_model_len=256).info.max_model_len == 256


async def test_request_that_can_never_fit_the_kv_pool_is_rejected_naming_max_tokens(make_engine) -> None:
    from inferd.engine.base import InvalidRequest
    engine = await make_engine(num_kv_blocks=4, block_size=16)
    with pytest.raises(InvalidRequest) as error:
        submit(engine, prompt(16), max_tokens=60)
    assert error.value.param == "max_tokens"


# -- synthetic tokens ----------------------------------------------------------------------------

async def test_eos_probability_from_the_profile_ends_some_streams_with_stop(make_engine) -> None:
    eager = msgspec.structs.replace(get_profile("tiny"), eos_probability=0.1)
    engine = await make_engine(eager)
    outputs = await asyncio.gather(*(finish(submit(engine, prompt(8, i), max_tokens=60, ignore_eos=False))
                                     for i in range(20)))
    stopped = [o for o in outputs if o.finish_reason is FinishReason.STOP]
    assert stopped and all(o.token_ids[-1] in engine.tokenizer.eos_token_ids for o in stopped)
    assert all(o.text == engine.tokenizer.decode(o.token_ids) for o in outputs)
    ignoring = await asyncio.gather(*(finish(submit(engine, prompt(8, i), max_tokens=60)) for i in range(20)))
    assert all(o.finish_reason is FinishReason.LENGTH for o in ignoring)


async def test_default_profiles_never_emit_eos(make_engine) -> None:
    engine = await make_engine()
    outputs = await asyncio.gather(*(finish(submit(engine, prompt(8, i), max_tokens=50, ignore_eos=False))
                                     for i in range(10)))
    assert all(o.finish_reason is FinishReason.LENGTH for o in outputs)


async def test_outputs_depend_on_prompt_and_seed(make_engine) -> None:
    engine = await make_engine()
    greedy = [(await finish(submit(engine, prompt(8, i), max_tokens=8))).token_ids for i in (1, 2)]
    seeded = [(await finish(submit(engine, prompt(8, 1), max_tokens=8, temperature=0.8, seed=s))).token_ids
              for s in (1, 2)]
    assert greedy[0] != greedy[1] and seeded[0] != seeded[1]


def test_tokenizer_round_trips_any_text() -> None:
    tokenizer = SimTokenizer(4096)
    text = "Hello, Wörld! naïve 日本語 tabs\tand\nnewlines  double  spaces 3.14 ~`_"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode(text)[0] == tokenizer.bos_token_id
    assert all(0 <= t < 4096 for t in tokenizer.encode(text))


def test_chat_template_turn_markers_encode_as_special_tokens() -> None:
    tokenizer = SimTokenizer(4096)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered.endswith("<|im_start|>assistant\n")
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    assert ids.count(tokenizer.encode("<|im_end|>", add_special_tokens=False)[0]) == 1
    assert tokenizer.eos_token_ids[1] in ids      # <|im_end|> ends a turn
    assert tokenizer.decode(ids) == "user\nhi\nassistant\n"


def test_chat_template_renders_tools_calls_and_results_in_hermes_tags() -> None:
    tokenizer = SimTokenizer(4096)
    tools = [{"type": "function", "function": {"name": "clock"}}]
    rendered = tokenizer.apply_chat_template([
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                             "function": {"name": "clock", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "c", "content": "noon"}], tools=tools)
    assert rendered.startswith('<|begin_of_text|><|im_start|>system\n# Tools\n<tools>\n'
                               '{"type": "function", "function": {"name": "clock"}}\n</tools><|im_end|>\n')
    assert '<|im_start|>assistant\n\n<tool_call>\n{"name": "clock", "arguments": {}}\n</tool_call><|im_end|>' in rendered
    assert "<|im_start|>tool\n<tool_response>\nnoon\n</tool_response><|im_end|>" in rendered
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=None) == \
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


def test_decode_keeps_the_special_tokens_when_asked_and_they_encode_back() -> None:
    tokenizer = SimTokenizer(4096)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "héllo"}])
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == rendered
    assert tokenizer.encode(tokenizer.eos_token, add_special_tokens=False) == [tokenizer.eos_token_ids[0]]
    assert tokenizer.encode(tokenizer.bos_token, add_special_tokens=False) == [tokenizer.bos_token_id]


def test_generated_pieces_concatenate_to_the_decoded_text() -> None:
    tokenizer = SimTokenizer(4096)
    ids = tokenizer.generation_ids[::97]
    assert tokenizer.decode(ids) == "".join(tokenizer.piece(t) for t in ids)


# -- identity ------------------------------------------------------------------------------------

def test_info_names_the_simulator() -> None:
    engine = SimEngine("llama3-8b-h100", model_name="llama-sim")
    assert (engine.info.backend, engine.info.simulated, engine.info.model_name) == ("sim", True, "llama-sim")
    assert engine.info.version == SimEngine("llama3-8b-h100").info.version != SimEngine("tiny").info.version


def test_bad_construction_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown sim profile 'h200'.*llama3-8b-h100"):
        SimEngine("h200")
    with pytest.raises(ValueError, match="time_scale"):
        SimEngine("tiny", time_scale=-1)
    with pytest.raises(ValueError, match="max_batch_size"):
        SimEngine("tiny", max_batch_size=0)


async def test_idle_engine_waits_without_stepping(make_engine) -> None:
    engine = await make_engine()
    await finish(submit(engine, prompt(8), max_tokens=3))
    steps = engine.stats().steps_total
    for _ in range(20):
        await asyncio.sleep(0)
    assert engine.stats().steps_total == steps
    await finish(submit(engine, prompt(8), max_tokens=3))       # and wakes for new work
    assert engine.stats().steps_total > steps


async def test_abort_during_a_step_frees_blocks_before_the_step_ends(make_engine) -> None:
    engine = await make_engine(time_scale=1.0, num_kv_blocks=32)
    stream = submit(engine, prompt(40), max_tokens=100)
    await asyncio.wait_for(stream.__anext__(), 30)
    assert engine.capacity().free_kv_blocks < 32
    engine.abort(stream.request_id)
    assert engine.capacity().free_kv_blocks == 32
    final = merge_deltas([d async for d in stream])
    assert final.finish_reason is FinishReason.ABORT


async def test_a_step_loop_bug_fails_requests_with_a_safe_message_and_logs_the_details(make_engine) -> None:
    engine = await make_engine(time_scale=1.0)
    running = submit(engine, prompt(8), max_tokens=500)
    await asyncio.wait_for(running.__anext__(), 30)

    def broken_schedule():
        raise RuntimeError("secret scheduler state")

    engine._scheduler.schedule = broken_schedule
    with json_log("inferd.engine.sim") as lines:
        final = await finish(running)
    assert final.finish_reason is FinishReason.ERROR and final.error == failure_message(running.request_id)
    assert any(line["exc"] == "secret scheduler state" and running.request_id in line["request_ids"]
               for line in lines)
    assert not engine.healthy
    with pytest.raises(EngineUnavailable):
        submit(engine, prompt(8), max_tokens=2)


async def test_step_observer_gets_each_step_in_simulated_seconds(make_engine) -> None:
    engine = await make_engine(time_scale=0.0)
    steps: list[float] = []
    engine.step_observer = steps.append
    await finish(submit(engine, prompt(40), max_tokens=6))
    assert len(steps) == engine.stats().steps_total and all(s > 0 for s in steps)
    assert sum(steps) == pytest.approx(engine.sim_time) and steps[-1] == engine.stats().step_latency_s

    def broken(step_s: float) -> None:
        raise RuntimeError("metrics bug")

    engine.step_observer = broken            # logged, never fatal
    assert (await finish(submit(engine, prompt(8), max_tokens=3))).finish_reason is FinishReason.LENGTH
    assert engine.healthy


# -- yielding a slot (admission's fair slots) ----------------------------------------------------

async def test_a_yielded_slot_is_free_at_once_and_the_parked_stream_resumes_with_the_same_tokens(make_engine):
    engine = await make_engine(max_batch_size=1)
    expected = (await finish(submit(engine, prompt(20), max_tokens=400))).token_ids
    hog = submit(engine, prompt(20), max_tokens=400)      # long: still running when it is asked to yield
    head = await hog.__anext__()
    assert engine.capacity().free_slots == 0
    assert engine.yield_slot(hog.request_id) and not engine.yield_slot(hog.request_id)
    cap = engine.capacity()
    assert cap.free_slots == 1 and cap.parked == 1 and cap.parked_kv_blocks > 0
    newcomer = await finish(submit(engine, prompt(9, salt=1), max_tokens=3))
    rest = await finish(hog)
    assert newcomer.timing.finished < rest.timing.finished      # it ran in the one slot while the hog waited
    assert head.token_ids + rest.token_ids == expected
    assert engine.stats().fairness_preemptions_total == 1 and engine.capacity().parked == 0
