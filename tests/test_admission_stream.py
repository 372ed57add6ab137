"""inferd.admission_stream: output charged while a request runs, and the deadline while it generates."""
import asyncio

import pytest

from inferd.tenants import TenantConfig
from inferd.types import Delta, FinishReason

from tests.admission_harness import far, make_queue, req  # noqa: F401


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
