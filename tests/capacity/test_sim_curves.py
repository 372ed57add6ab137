from __future__ import annotations

import pytest

from inferd.capacity import CapacityError, SloUnreachable, sim_curve, sim_profile_names
from inferd.capacity.sim_curves import full_budget_prefill_rate, prefill_seconds
from inferd.engine.sim import PROFILES

from tests.capacity.helpers import demand

H100 = PROFILES["llama3-8b-h100"]


def test_the_default_profiles_are_the_shipped_ones_but_the_test_toy():
    assert "tiny" not in sim_profile_names()
    assert {"llama3-8b-h100", "llama3-70b-4xh100"} <= set(sim_profile_names())


def test_a_replica_of_a_tensor_parallel_profile_is_that_many_gpus():
    assert sim_curve("llama3-70b-4xh100", demand()).gpus_per_replica == 4
    assert sim_curve("llama3-8b-h100", demand()).gpus_per_replica == 1


def test_decode_steps_are_the_profiles_at_the_mean_decode_context():
    c = sim_curve("llama3-8b-h100", demand(prompt={"mean": 1000}, output={"mean": 400}))
    assert c.step_s(64) == H100.decode_step_time(64, 1200)


def test_a_prompt_longer_than_the_budget_is_prefilled_in_priced_chunks():
    # two chunks: 8192 tokens from 0, then 1808 after 8192 (reading all 10000 KV entries)
    expected = (H100.step_time(8192, 8192, 8192 * 8193 // 2)
                + H100.step_time(1808, 10000, 1808 * 8192 + 1808 * 1809 // 2))
    assert prefill_seconds(H100, 10000, 8192) == pytest.approx(expected)


def test_short_prompts_sharing_a_full_budget_prefill_faster_than_one_alone():
    # 64 tokens alone are bound by reading the weights; 128 of them in one step share that read
    alone = 64 / prefill_seconds(H100, 64, 8192)
    assert full_budget_prefill_rate(H100, 64, 8192) > 2 * alone


def test_long_p95_sequences_shrink_the_batch_to_what_the_kv_pool_holds():
    short = sim_curve("llama3-8b-h100", demand())
    long = sim_curve("llama3-8b-h100", demand(prompt={"mean": 500, "p95": 8000}, output={"mean": 500, "p95": 2000}))
    assert (short.max_batch, short.max_batch_reason) == (256, "slots")
    assert long.max_batch == H100.num_kv_blocks(16) // (10000 // 16) and long.max_batch_reason == "KV"


def test_a_sequence_bigger_than_the_kv_pool_is_unreachable():
    with pytest.raises(SloUnreachable, match="does not fit the KV pool"):
        sim_curve("tiny", demand(prompt={"mean": 100, "p95": 9000}))


def test_an_unknown_profile_lists_the_known_ones():
    with pytest.raises(CapacityError, match="unknown sim profile 'h200'; known: .*llama3-8b-h100"):
        sim_curve("h200", demand())
