"""inferd.admission.stream: output charged while a request runs, and the deadline while it generates."""
import asyncio

import pytest

from inferd.admission.stream import CHARGE_EVERY_TOKENS
from inferd.config.tenants import TenantConfig
from inferd.types import Delta, FinishReason, Usage
from tests.admission.harness import far, make_queue, req  # noqa: F401


async def test_deadline_while_generating_aborts_and_final_chunk_says_deadline(make_queue):
    q, engine = make_queue()
    stream = await q.admit(req("a"), deadline=asyncio.get_running_loop().time() + 0.02)
    final = await stream.collect()
    assert final.finish_reason is FinishReason.DEADLINE and engine.aborted == [stream.request_id]


async def test_output_is_charged_to_the_counter_as_it_streams(make_queue):
    q, engine = make_queue(tenants={"a": TenantConfig(weight=2)})
    stream = await q.admit(req("a", prompt=32), deadline=far())
    assert q.counters["a"] == pytest.approx(32 / 2)
    engine.streams[stream.request_id].push(Delta(token_ids=[1, 2, 3]))
    await stream.__anext__()
    assert q.counters["a"] == pytest.approx((32 + 2 * 3) / 2)
    engine.finish(stream.request_id, n_out=1)
    await stream.collect()
    snap = q.snapshot()["tenants"]["a"]
    assert snap["output_tokens"] == 4 and snap["ttft_count"] == 1 and snap["admitted"] == 1


async def test_output_is_charged_while_a_long_generation_runs_not_only_at_the_end(make_queue):
    q, engine = make_queue(tenants={"a": TenantConfig(weight=2)})
    stream = await q.admit(req("a", prompt=32, max_tokens=1000), deadline=far())
    pushed = engine.streams[stream.request_id]
    for n in range(1, 301):
        pushed.push_token(7, " x")                  # one token per engine step, read as it comes
        assert len(stream.take().token_ids) == 1
        charged_tokens = (q.counters["a"] * 2 - 32) / 2
        assert n - CHARGE_EVERY_TOKENS < charged_tokens <= n     # never owes more than a charge step
    assert q.snapshot()["tenants"]["a"]["output_tokens"] > 300 - CHARGE_EVERY_TOKENS
    pushed.push(Delta(token_ids=[7], finish_reason=FinishReason.LENGTH,
                      usage=Usage(prompt_tokens=32, completion_tokens=301)))
    assert stream.take().finish_reason is FinishReason.LENGTH
    assert q.counters["a"] == pytest.approx((32 + 2 * 301) / 2)   # the end settles the exact total
    assert q.snapshot()["tenants"]["a"]["output_tokens"] == 301


async def test_a_cancelled_stream_is_charged_for_everything_it_delivered(make_queue):
    q, engine = make_queue(tenants={"a": TenantConfig()})
    stream = await q.admit(req("a", prompt=16), deadline=far())
    for _ in range(5):
        engine.streams[stream.request_id].push_token(7, " x")
        await stream.__anext__()
    stream.cancel()
    assert q.counters["a"] == pytest.approx(16 + 2 * 5)
    assert q.snapshot()["tenants"]["a"]["output_tokens"] == 5 and q.snapshot()["running"] == 0
