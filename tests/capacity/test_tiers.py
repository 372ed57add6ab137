"""Precision tiers in a capacity plan: each share on its own profile, with its own targets and cost."""
from __future__ import annotations

import json

import pytest

from inferd.capacity import capacity_main
from inferd.capacity.demand import build_demand
from inferd.capacity.errors import DemandError
from inferd.capacity.tiers import read_tiers
from tests.capacity.helpers import parse

DEMAND = """requests_per_s = 40
[prompt]
mean = 1500
p95 = 4000
[output]
mean = 300
[slo]
ttft_p95_ms = 1000
itl_p99_ms = 50
[tiers.interactive]
share = 0.3
profile = "llama3-70b-4xh100"
[tiers.batch]
share = 0.7
profile = "llama3-70b-2xh100-fp8"
ttft_p95_ms = 0
itl_p99_ms = 0
"""


def test_each_tier_is_planned_on_its_precision_and_the_cheaper_one_costs_less_per_token(tmp_path, capsys):
    path = tmp_path / "demand.toml"
    path.write_text(DEMAND)
    assert capacity_main(parse("--demand", str(path), "--gpu-hour-cost", "2.5", "--json")) == 0
    interactive, batch = json.loads(capsys.readouterr().out)["tiers"]
    assert (interactive["tier"], interactive["profile"], batch["profile"]) == (
        "interactive", "llama3-70b-4xh100", "llama3-70b-2xh100-fp8")
    assert interactive["requests_per_s"] == pytest.approx(12) and batch["requests_per_s"] == pytest.approx(28)
    assert interactive["gpus"] % 4 == 0 and batch["gpus"] % 2 == 0       # whole replicas of each profile
    assert interactive["cost_per_hour"] == interactive["gpus"] * 2.5
    assert batch["cost_per_1k_tokens"] < interactive["cost_per_1k_tokens"]
    assert capacity_main(parse("--demand", str(path))) == 0
    out = capsys.readouterr().out
    assert "per tier" in out and "llama3-70b-2xh100-fp8" in out


def test_a_tiers_own_targets_replace_the_demands_and_zero_means_none():
    raw = {"requests_per_s": 10, "prompt": {"mean": 100}, "output": {"mean": 50}, "slo": {"itl_p99_ms": 50},
           "tiers": {"fast": {"share": 0.5, "profile": "p", "itl_p99_ms": 20}, "slow": {"share": 0.5, "profile": "q",
                                                                                     "itl_p99_ms": 0}}}
    fast, slow = read_tiers(raw, build_demand(raw))
    assert (fast.demand.itl_p99_ms, slow.demand.itl_p99_ms, fast.demand.requests_per_s) == (20, None, 5)


@pytest.mark.parametrize("tiers, message", [
    ({"a": {"share": 0.5, "profile": "p"}}, "the tiers' shares add up to 0.5, not 1"),
    ({"a": {"share": 1.5, "profile": "p"}}, "tiers.a.share must be a number in (0, 1]"),
    ({"a": {"share": 1, "profile": "p", "gpu": "h100"}}, "tiers.a.gpu: unknown key"),
    ({"a": {"share": 1}}, "tiers.a.profile must name a profile"),
])
def test_a_bad_tier_is_named(tiers, message):
    raw = {"requests_per_s": 10, "prompt": {"mean": 100}, "output": {"mean": 50}, "tiers": tiers}
    with pytest.raises(DemandError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        read_tiers(raw, build_demand(raw))
