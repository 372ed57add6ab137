"""bench/lifecycle.py as a smoke test: a short simulated run (two minutes of arrivals) accounts for every
request, is deterministic for a seed, drives the real Residency policy (hysteresis's victims are never
younger than the minimum residency), and renders the table and the two verdict lines. Shape and
bookkeeping only: whether hysteresis meets the issue's goals is the full run's finding, not a test's.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.scripts import load_script

# A benchmark: run by `pytest -m bench` (.ci/run does, after the default run), never the default run.
pytestmark = pytest.mark.bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "lifecycle.py"
ARGS = ["--duration-s", "120", "--rate", "1", "--drift-period-s", "30", "--seed", "5"]


@pytest.fixture(scope="module")
def bench():
    return load_script("lifecycle")


def test_a_short_run_accounts_for_every_request_under_both_policies(bench):
    args = bench.parse_args(ARGS)
    result = bench.run(args)
    load_s = result["workload"]["load_s"]
    assert 8 < load_s < 9                                            # llama3-8b-h100 from a 2 GB/s disk
    assert result["workload"]["min_residency_s"] == pytest.approx(3 * load_s)
    assert set(result["runs"]) == {"lru", "hysteresis"}
    for policy, run in result["runs"].items():
        assert run["requests"] == result["offered"] > 0             # one arrival sequence for both
        assert run["served"] + run["refused"] + run["timed_out"] == run["requests"]
        assert run["hits"] + run["cold_requests"] == run["requests"]
        assert run["cold_served"] <= run["cold_requests"] and run["good"] <= run["served"]
        assert run["loads"] >= 4 and run["evictions"] <= run["loads"]   # at first four load without evicting
        assert run["goodput"] == pytest.approx(run["good"] / 120)
        if run["cold_served"]:
            assert load_s <= run["cold_wait_p50_s"] <= run["cold_wait_p99_s"] <= args.timeout_s
    assert result["runs"]["lru"]["min_residency_s"] == 0.0
    youngest = result["runs"]["hysteresis"]["min_victim_age_s"]
    assert youngest is None or youngest >= 3 * load_s - 1e-6           # the policy's hysteresis, honoured


def test_the_same_seed_gives_the_same_figures_and_another_seed_other_arrivals(bench):
    first, again = bench.run(bench.parse_args(ARGS)), bench.run(bench.parse_args(ARGS))
    assert first["runs"] == again["runs"]
    other = bench.run(bench.parse_args([*ARGS[:-1], "6"]))
    assert other["offered"] != first["offered"] or other["runs"] != first["runs"]


def test_zipf_ranks_rotate_with_the_drift_period(bench):
    args = bench.parse_args(["--duration-s", "600", "--rate", "20", "--drift-period-s", "300", "--zipf-s", "2"])
    schedule = bench.arrivals(args)
    for epoch, favourite in ((0, 0), (1, args.models - 1)):       # the least popular becomes the most popular
        models = [m for t, m in schedule if epoch * 300 <= t < (epoch + 1) * 300]
        assert max(set(models), key=models.count) == favourite


def test_the_script_prints_json_and_the_table_with_computed_verdicts(bench):
    out = subprocess.run([sys.executable, str(BENCH), *ARGS, "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    verdict = result["verdict"]
    assert set(verdict["per_figure"]) == {"hit_rate", "cold_wait_p50_s", "cold_wait_p99_s", "goodput"}
    assert verdict["at_least_plain_lru_on_every_figure"] == (not verdict["worse_on"])
    assert set(verdict["no_eviction_storm"]) == {"lru", "hysteresis"}

    text = bench.render(result, bench.parse_args(ARGS))
    lines = text.splitlines()
    assert sum(line.startswith("verdict: ") for line in lines) == 2
    assert any(line.startswith("hit rate") and "%" in line for line in lines)
    assert any(line.startswith("goodput at SLO") for line in lines)
