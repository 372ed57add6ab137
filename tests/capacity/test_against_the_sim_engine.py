"""The planner's per-replica figures against the simulated engine they are derived from.

A full batch of requests submitted at once keeps the engine saturated, so its simulated time is the
replica time the planner says that work costs: prefill at the full-budget rate plus decode at the
planned batch (the colocated sum), not the larger of the two.
"""
from __future__ import annotations

import asyncio

import pytest

from inferd.capacity import sim_curve
from inferd.engine.sim import SimEngine
from inferd.types import GenerationRequest, SamplingParams

from tests.capacity.helpers import demand


async def simulated_seconds(count: int, prompt_len: int, output_len: int) -> float:
    engine = SimEngine("llama3-8b-h100", time_scale=0.0, max_batch_size=count, max_num_tokens=8192)
    await engine.start()
    try:
        streams = [engine.submit(GenerationRequest(
            request_id=f"cap-{i}", prompt_token_ids=tuple(300 + (i * 31 + k) % 3000 for k in range(prompt_len)),
            sampling=SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)))
            for i in range(count)]
        await asyncio.wait_for(asyncio.gather(*(s.collect() for s in streams)), 30)
        return engine.sim_time
    finally:
        await engine.close()


async def test_a_saturated_replica_takes_the_prefill_plus_the_decode_time_the_curve_predicts():
    d = demand(prompt={"mean": 1500}, output={"mean": 200})
    c = sim_curve("llama3-8b-h100", d, max_batch_size=64)
    batch = c.decode_batch_within(None)
    prefill_s = batch * 1500 / c.prefill_tokens_per_s
    decode_s = 200 * c.step_s(batch)                      # 200 steps of the whole batch
    measured = await simulated_seconds(batch, 1500, 200)
    assert measured == pytest.approx(prefill_s + decode_s, rel=0.05)
    assert measured > 1.3 * max(prefill_s, decode_s)     # the binding side alone undercounts it
