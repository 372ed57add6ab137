"""Benchmark guards for bench/speculative.py and bench/quantized.py: ratios within one run, with margins a loaded
machine holds (the issue's goals are 1.5x, 0.95x and 0.3x; measured 2.1x, 0.99x and 0.25x)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

# A benchmark: run by `pytest -m bench` (.ci/run does, after the default run), never the default run.
pytestmark = pytest.mark.bench

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def figure(text: str, label: str) -> float:
    found = re.search(re.escape(label) + r": ([0-9.]+)", text)
    assert found, f"no line {label!r} in:\n{text}"
    return float(found.group(1))


@pytest.mark.slow
def test_prompt_lookup_speeds_up_a_copying_workload_and_costs_nothing_on_another():
    text = run("speculative.py", "--requests", "4", "--max-tokens", "96")
    assert figure(text, "speculative speedup, repetitive") >= 1.4
    assert figure(text, "speculative speedup, non-repetitive") >= 0.85
    assert figure(text, "acceptance rate, repetitive") > 0.8


@pytest.mark.slow
def test_int8_holds_under_a_third_of_the_float_weights_at_the_same_perplexity():
    text = run("quantized.py", "--requests", "1", "--batches", "1", "--prompts", "4")
    assert figure(text, "weight memory int8/float32") <= 0.3
    assert abs(figure(text, "perplexity int8/float32") - 1) <= 0.02
