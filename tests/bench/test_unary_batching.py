"""bench/unary_batching.py as a smoke test: a tiny run (two loads, 0.3 s each) finishes, accounts for
every request it offered, and its result renders as the table and verdict the docs quote. Shape and
bookkeeping only, never a goodput bound: the figures belong to the full run on a quiet machine.
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

BENCH = Path(__file__).resolve().parents[2] / "bench" / "unary_batching.py"
ARGS = ["--duration-s", "0.3", "--loads", "2,0.5", "--max-batch-size", "8", "--seed", "3"]


def load_bench():
    return load_script("unary_batching")


def test_a_tiny_run_accounts_for_every_request_and_renders_the_table_and_verdict():
    out = subprocess.run([sys.executable, str(BENCH), *ARGS, "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)

    assert result["capacity"]["rate"] > 0 and result["capacity"]["batch"] >= 1
    assert [level["load"] for level in result["levels"]] == [0.5, 2.0]        # sorted, lowest first
    for level in result["levels"]:
        assert set(level["runs"]) == {"none", "window", "deadline"}
        assert level["offered"] > 0
        for run in level["runs"].values():
            assert run["offered"] == level["offered"]                          # one schedule for all three
            assert run["good"] + run["late"] + run["dropped"] + run["unfinished"] == run["offered"]
            assert abs(run["goodput"] - run["good"] / 0.3) < 1e-6
            assert run["batches"] >= 1 and 1 <= run["max_batch"] <= 8
        assert level["runs"]["none"]["max_batch"] == 1
        assert level["runs"]["none"]["dropped"] == level["runs"]["window"]["dropped"] == 0   # only (c) drops
    verdict = result["verdict"]
    assert verdict["lowest_load"] == 0.5
    assert isinstance(verdict["never_worse_than_none"], bool)
    assert verdict["window_misses_at"] in (None, 0.5, 2.0) and verdict["window_collapses_at"] in (None, 0.5, 2.0)

    bench = load_bench()
    text = bench.render(result, bench.parse_args(ARGS))
    lines = text.splitlines()
    rows = [line for line in lines if line.lstrip().startswith(("0.50 ", "2.00 "))]
    assert len(rows) == 2 and all(line.count("|") == 4 for line in rows)
    assert sum(line.startswith("verdict: ") for line in lines) == 2
    assert "capacity (1.0x)" in text
