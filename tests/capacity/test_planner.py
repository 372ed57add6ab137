from __future__ import annotations

import pytest

from inferd.capacity import SloUnreachable, plan_capacity, sim_curve, survive_zone_loss
from inferd.capacity.planner import replicas_for

from tests.capacity.helpers import curve, demand


def plan(**demand_fields):
    d = demand(**demand_fields)
    return plan_capacity(sim_curve("llama3-8b-h100", d), d)


def test_the_binding_side_moves_from_decode_to_prefill_as_prompts_outgrow_outputs():
    assert plan(prompt={"mean": 100}, output={"mean": 1000}).binding == "decode"
    long_prompts = plan(prompt={"mean": 6000}, output={"mean": 20})
    assert long_prompts.binding == "prefill"
    assert long_prompts.replicas == long_prompts.prefill_replicas > long_prompts.decode_replicas


def test_a_tighter_itl_target_needs_more_gpus():
    loose = plan(requests_per_s=50, slo={"itl_p99_ms": 50})
    tight = plan(requests_per_s=50, slo={"itl_p99_ms": 8})
    assert tight.decode_batch < loose.decode_batch and tight.decode_step_s <= 0.008
    assert tight.gpus > loose.gpus


def test_replicas_carry_the_load_at_no_more_than_the_target_utilisation():
    p = plan_capacity(curve(), demand(requests_per_s=10, prompt={"mean": 2000}, output={"mean": 10}))
    assert p.prefill_load == pytest.approx(2.0)                  # 20k prompt tok/s over 10k per replica
    assert (p.prefill_replicas, p.replicas, p.gpus) == (3, 3, 3)  # 2.0 / 0.8 = 2.5 -> 3
    assert p.prefill_utilisation == pytest.approx(2 / 3) and p.headroom == pytest.approx(1 / 3)


def test_colocated_replicas_carry_both_loads_together():
    p = plan(prompt={"mean": 1500}, output={"mean": 300}, requests_per_s=50)
    assert p.colocated_replicas == replicas_for(p.prefill_load + p.decode_load, 0.8) > p.replicas


def test_exact_loads_are_not_rounded_up_by_float_noise():
    assert (0.1 + 0.2) * 8 / 0.8 > 3                 # 3.0000000000000004
    assert replicas_for((0.1 + 0.2) * 8, 0.8) == 3
    assert replicas_for(2.41, 0.8) == 4


def test_a_prompt_whose_prefill_alone_exceeds_the_ttft_target_is_unreachable():
    with pytest.raises(SloUnreachable, match=r"no replica count meets ttft_p95_ms=40: .*4000 tokens\) alone takes"):
        plan(prompt={"mean": 1000, "p95": 4000}, slo={"ttft_p95_ms": 40})


def test_losing_the_largest_zone_still_leaves_what_is_needed():
    for needed in range(1, 40):
        for zones in range(2, 7):
            split = survive_zone_loss(needed, zones)
            assert len(split) == zones and max(split) - min(split) <= 1
            assert sum(split) - max(split) >= needed
            fewer = sum(split) - 1   # and one replica less would not survive
            assert fewer - -(-fewer // zones) < needed


def test_more_zones_cost_fewer_spare_replicas():
    spare = [sum(survive_zone_loss(10, zones)) - 10 for zones in (2, 3, 4, 5)]
    assert spare == [10, 5, 4, 3]


def test_one_zone_cannot_survive_losing_it():
    assert survive_zone_loss(4, 1) is None
    assert plan(zones=1).zone_gpus is None
    with pytest.raises(ValueError):
        survive_zone_loss(4, 0)


def test_zone_gpus_count_every_gpu_of_a_tensor_parallel_replica():
    d = demand(requests_per_s=50, zones=3)
    p = plan_capacity(sim_curve("llama3-70b-4xh100", d), d)
    assert p.zone_gpus == 4 * p.zone_replicas and p.gpus == 4 * p.replicas
