"""UnaryEngine: batches form from what admission released, vectors come back one per request, and
aborts, hopeless deadlines and encoder failures each end the right streams without losing others."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from inferd.engine import EngineUnavailable, InvalidRequest
from inferd.engine.unary import DeadlineAware, FixedWindow, LoadedEncoder, NoBatching, UnaryEngine
from inferd.types import FinishReason, GenerationRequest, SamplingParams


class FakeTokenizer:
    eos_token_ids = (0,)
    vocab_size = 100


class FakeEncoder:
    """Vectors [sum of ids, length, 0, 0] normalized; `gate` (when set) holds each batch until released."""

    tokenizer = FakeTokenizer()
    dimensions = 4
    max_model_len = 64
    matryoshka_min_dimensions = 2

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[tuple[int, ...]]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.fail = fail

    def encode(self, batch):
        self.batches.append([tuple(ids) for ids in batch])
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail:
            raise RuntimeError("boom")
        out = np.array([[sum(ids), len(ids), 0, 0] for ids in batch], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
async def make_engine():
    engines = []

    async def make(policy=None, encoder=None, max_batch_size=8, max_batch_tokens=64):
        enc = encoder or FakeEncoder()
        engine = UnaryEngine(lambda: LoadedEncoder(enc, "fake", "v1"), policy or NoBatching(), backend="reference",
                             max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens, hardware="cpu")
        await engine.start()
        engines.append(engine)
        return engine, enc

    yield make
    for engine in engines:
        await engine.close()


def req(rid: str, ids=(1, 2, 3), deadline: float | None = None) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(ids), sampling=SamplingParams(max_tokens=0),
                             deadline=deadline)


async def test_a_request_gets_one_final_delta_with_its_vector_and_usage(make_engine):
    engine, _ = await make_engine()
    assert (engine.info.task, engine.info.dimensions, engine.info.min_dimensions) == ("embed", 4, 2)
    final = await engine.submit(req("a", (1, 2, 3))).collect()
    assert final.finish_reason is FinishReason.STOP and final.token_ids == []
    assert final.usage.prompt_tokens == 3 and final.usage.completion_tokens == 0
    np.testing.assert_allclose(final.embedding, np.array([6, 3, 0, 0]) / np.hypot(6, 3), rtol=1e-6)
    assert final.timing.first_scheduled >= final.timing.submitted and final.timing.finished is not None


async def test_requests_arriving_while_a_batch_computes_form_the_next_batch(make_engine):
    engine, enc = await make_engine(FixedWindow(0.0))
    enc.gate = threading.Event()
    first = engine.submit(req("a"))
    await asyncio.to_thread(enc.entered.wait, 5)
    rest = [engine.submit(req(f"r{i}", (i + 1,))) for i in range(3)]
    cap = engine.capacity()
    assert (cap.free_slots, cap.free_kv_tokens) == (8 - 3, 64 - 3)      # the forming batch's room
    enc.gate.set()
    finals = [await s.collect() for s in [first, *rest]]
    assert [f.finish_reason for f in finals] == [FinishReason.STOP] * 4
    assert enc.batches == [[(1, 2, 3)], [(1,), (2,), (3,)]]


async def test_the_same_input_gives_the_same_vector_alone_or_batched(make_engine):
    engine, _ = await make_engine(FixedWindow(0.005))
    alone = (await engine.submit(req("x", (5, 6))).collect()).embedding
    streams = [engine.submit(req(f"b{i}", (5, 6) if i == 2 else (i + 1,) * (i + 1))) for i in range(4)]
    batched = [(await s.collect()).embedding for s in streams]
    np.testing.assert_allclose(batched[2], alone, rtol=1e-6)


async def test_aborting_a_waiting_request_ends_it_without_computing_it(make_engine):
    engine, enc = await make_engine(FixedWindow(10.0))
    stream = engine.submit(req("a", (9, 9)))
    engine.abort("a")
    final = await stream.collect()
    assert final.finish_reason is FinishReason.ABORT and final.embedding is None
    assert engine.capacity().free_slots == 8 and enc.batches == []


async def test_a_hopeless_deadline_is_answered_at_once_without_compute(make_engine):
    engine, enc = await make_engine(DeadlineAware(target_s=0.05, margin_s=0.001))
    engine.compute.observe(10, 0.010)                # 1 ms a token: a 3-token input needs 3 ms
    drops = []
    engine.deadline_drop_observer = drops.append
    final = await engine.submit(req("late", deadline=time.monotonic() + 0.001)).collect()
    assert final.finish_reason is FinishReason.DEADLINE and enc.batches == [] and drops == [1]
    ok = await engine.submit(req("ok", deadline=time.monotonic() + 1.0)).collect()
    assert ok.finish_reason is FinishReason.STOP


async def test_a_failing_batch_fails_its_requests_and_the_engine_keeps_serving(make_engine):
    enc = FakeEncoder(fail=True)
    engine, _ = await make_engine(encoder=enc)
    final = await engine.submit(req("a")).collect()
    assert final.finish_reason is FinishReason.ERROR and "failed" in final.error
    enc.fail = False
    assert (await engine.submit(req("b")).collect()).finish_reason is FinishReason.STOP
    assert engine.healthy


async def test_batches_are_reported_to_the_observer(make_engine):
    engine, enc = await make_engine(FixedWindow(0.0))
    records = []
    engine.batch_observer = records.append
    enc.gate = threading.Event()
    first = engine.submit(req("a", (1,) * 8))
    await asyncio.to_thread(enc.entered.wait, 5)
    later = [engine.submit(req(f"r{i}", (1,) * 8)) for i in range(2)]
    enc.gate.set()
    for s in [first, *later]:
        await s.collect()
    assert [(r.size, r.tokens) for r in records] == [(1, 8), (2, 16)]
    assert records[1].fill == pytest.approx(max(2 / 8, 16 / 64)) and records[1].wait_s >= 0
    assert engine.stats().steps_total == 2 and engine.stats().prompt_tokens_total == 24


async def test_invalid_inputs_are_refused_at_submit(make_engine):
    engine, _ = await make_engine()
    with pytest.raises(InvalidRequest):
        engine.submit(req("e", ()))
    with pytest.raises(InvalidRequest):
        engine.submit(req("long", (1,) * 65))


async def test_closing_aborts_what_is_waiting_and_refuses_new_work(make_engine):
    engine, _ = await make_engine(FixedWindow(10.0))
    stream = engine.submit(req("a"))
    await engine.close()
    assert (await stream.collect()).finish_reason is FinishReason.ABORT
    with pytest.raises(EngineUnavailable):
        engine.submit(req("b"))


async def test_an_encoder_returning_too_few_vectors_fails_the_batch_not_the_engine(make_engine):
    enc = FakeEncoder()
    real = enc.encode
    enc.encode = lambda batch: real(batch)[:-1]
    engine, _ = await make_engine(FixedWindow(0.0), encoder=enc)
    final = await engine.submit(req("a")).collect()
    assert final.finish_reason is FinishReason.ERROR and engine.healthy


async def test_a_failing_batcher_fails_what_waits_and_the_engine_turns_unhealthy(make_engine):
    class Broken:
        name = "broken"

        def plan(self, *args):
            raise RuntimeError("a bug in a policy")

    engine, _ = await make_engine(Broken())
    final = await engine.submit(req("a")).collect()
    assert final.finish_reason is FinishReason.ERROR
    assert not engine.healthy
    await engine.close()                        # does not raise the batcher's error


async def test_a_raising_drop_observer_does_not_stop_the_batcher(make_engine):
    engine, _ = await make_engine(DeadlineAware(target_s=0.05, margin_s=0.001))
    engine.compute.observe(10, 0.010)

    def boom(n):
        raise RuntimeError("metrics bug")

    engine.deadline_drop_observer = boom
    late = await engine.submit(req("late", deadline=time.monotonic() + 0.001)).collect()
    assert late.finish_reason is FinishReason.DEADLINE
    assert (await engine.submit(req("ok")).collect()).finish_reason is FinishReason.STOP


async def test_an_input_is_at_most_a_batchs_tokens(make_engine):
    engine, _ = await make_engine(max_batch_tokens=32)          # the model's context is 64
    assert engine.info.max_model_len == 32
    with pytest.raises(InvalidRequest):
        engine.submit(req("long", (1,) * 33))
