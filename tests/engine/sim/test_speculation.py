"""The sim's speculative decoding: decode steps shortened by the expected tokens per verification, counted."""
from __future__ import annotations

import pytest

from inferd.config.root import ConfigError, parse_config
from inferd.engine.sim import SimEngine
from inferd.engine.sim.speculation import SimSpeculation
from inferd.types import GenerationRequest, SamplingParams
from tests.engine.backends import started_engines


async def simulated_seconds(speculation: SimSpeculation | None) -> tuple[float, SimEngine]:
    async with started_engines(lambda: SimEngine("llama3-8b-h100", time_scale=0.0, speculation=speculation)) as make:
        engine = await make()
        streams = [engine.submit(GenerationRequest(request_id=f"r{i}", prompt_token_ids=tuple(range(1, 65)),
                                                   sampling=SamplingParams(max_tokens=200, ignore_eos=True)))
                   for i in range(8)]
        for s in streams:
            assert len((await s.collect()).token_ids) == 200
        return engine.sim_time, engine


async def test_decoding_takes_the_roofline_time_over_the_expected_tokens_per_verification():
    plain, _ = await simulated_seconds(None)
    spec = SimSpeculation(4, 0.8)
    assert spec.tokens_per_step == pytest.approx((1 - 0.8 ** 5) / 0.2)           # 3.36
    faster, engine = await simulated_seconds(spec)
    # decode-bound at batch 8: the 5-token verifying step costs little more than a 1-token one
    assert plain / 3.36 < faster < plain / 2.5
    stats = engine.stats().speculation
    assert stats.draft_tokens == 4 * stats.verifications
    assert stats.accepted_tokens == pytest.approx(stats.verifications * 2.36, rel=0.01)


async def test_no_acceptance_only_costs():
    plain, _ = await simulated_seconds(None)
    slower, _ = await simulated_seconds(SimSpeculation(4, 0.0))
    assert slower >= plain


def test_the_sim_needs_an_acceptance_rate_and_only_the_sim_takes_one():
    sim = {"backend": "sim", "speculative": {}}
    with pytest.raises(ConfigError, match="acceptance_rate: the sim needs one"):
        parse_config({"models": {"m": sim}})
    with pytest.raises(ConfigError, match="acceptance_rate: only the sim takes one"):
        parse_config({"models": {"m": {"speculative": {"acceptance_rate": 0.5}}}})
    with pytest.raises(ConfigError, match=r"acceptance_rate: must be in \[0, 1\)"):
        parse_config({"models": {"m": {**sim, "speculative": {"acceptance_rate": 1.0}}}})
    assert parse_config({"models": {"m": {**sim, "speculative": {"acceptance_rate": 0.7}}}}).models[
        "m"].speculative.acceptance_rate == 0.7
