"""bench/node.py as a regression guard: ratios only, never a wall-clock bound.

At a load a fraction of one core carries (2 real-time sim engines x 4 streams), the front must deliver
what the engines produce at their simulated step times: ~0.99 on an idle machine, 0.76 at a load average
of ~10 on 2 cores (10 busy loops: the daemon got 8% of a core and waited for its time slices), where
48 streams gave 0.22 and 0.9 could not hold. A front that lost tokens or held the loop for whole steps
drops the ratio below the bound of 0.5, which holds at load 10.

The same run prints CPU per 1k tokens per process role and the projected node throughput: present and
positive, never bounded (absolute CPU time per token is the machine's speed as much as the code's).

The writer path (one SSE writer process, 2 x 128 streams) is guarded by a ratio of two runs in one test:
the engine-owning process's CPU per 1k tokens with the writer against the in-process daemon's.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# A benchmark: run by `pytest -m bench` (.ci/run does, after the default run), never the default run.
pytestmark = pytest.mark.bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "node.py"


@pytest.fixture(scope="module")
def node_run() -> tuple[dict, list[str]]:
    """One small run: its JSON report and its summary lines."""
    out = subprocess.run([sys.executable, str(BENCH), "--engines", "2", "--streams", "4", "--seconds", "4",
                          "--warmup", "4"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stderr.strip().splitlines()[-1]), out.stdout.splitlines()


@pytest.mark.slow
def test_the_front_delivers_what_real_time_engines_produce_at_a_load_it_can_carry(node_run):
    report, _ = node_run
    assert report["errors"] == 0 and report["arrivals"] > 1000
    assert report["ratio"] >= 0.5, report
    assert report["added_itl_ms"]["p99"] >= 0.0, report        # the write-delay histogram was fed (not NaN)


@pytest.mark.slow
def test_cpu_per_process_role_and_the_node_projection_are_printed_and_positive(node_run):
    report, lines = node_run
    engine = [line for line in lines if line.startswith("engine process CPU per 1k tokens: ")]
    assert len(engine) == 1, lines
    assert float(engine[0].split(": ", 1)[1].split()[0]) > 0
    assert report["roles"]["engine"]["processes"] == 1 and report["roles"]["engine"]["ms_per_1k_tokens"] > 0
    for role, figures in report["roles"].items():
        assert figures["ms_per_1k_tokens"] > 0, (role, figures)
        assert any(line.startswith(f"{role} process CPU per 1k tokens: ") for line in lines), role
    projected = report["projection"]
    assert projected["total_cores"] > 0 and 0 < projected["engine_core_tokens_per_s"] < float("inf")
    assert sum(line.startswith("projected node throughput: ") for line in lines) == 1, lines
    # the daemon's whole tree: the sum of every role's CPU
    assert report["server_cpu_ms_per_1k_tokens"] == pytest.approx(
        sum(r["ms_per_1k_tokens"] for r in report["roles"].values()))
    for name in ("node", "delivered/simulated tokens/s", "added ITL p99", "server CPU per 1k tokens",
                 "engine process GC pauses", "engines' step loops CPU per 1k tokens",
                 "load average (1, 5, 15 min) before"):
        assert any(line.startswith((f"{name}:", f"{name} ")) for line in lines), name
    # the sim engines' step loops ran on the engine process's loop: part of its CPU, never more
    assert 0 < report["step_loop_ms_per_1k_tokens"] < report["roles"]["engine"]["ms_per_1k_tokens"], report
    # the daemon's collector, timed through its /metrics (inferd_gc_pause_seconds): read for every generation
    assert set(report["gc"]) == {"0", "1", "2"}, report["gc"]


def node_report(front_processes: int) -> tuple[dict, list[str]]:
    """bench/node.py at 2 x 128 real-time sim streams with `front_processes` SSE writer processes, the load
    generator at nice 10 (a writer sharing its CPU runs first)."""
    out = subprocess.run([sys.executable, str(BENCH), "--engines", "2", "--streams", "128", "--seconds", "5",
                          "--warmup", "4", "--front-processes", str(front_processes), "--client-nice", "10"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stderr.strip().splitlines()[-1]), out.stdout.splitlines()


@pytest.fixture(scope="module")
def writer_runs() -> dict[int, tuple[dict, list[str]]]:
    """The in-process daemon and the daemon with one writer, one after the other in this test."""
    return {n: node_report(n) for n in (0, 1)}


@pytest.mark.slow
def test_with_a_writer_the_engine_process_spends_less_cpu_per_token_and_delivers_what_engines_produce(writer_runs):
    """The writer path's point: frames encoded and written elsewhere take CPU off the engine-owning process.
    Measured on 2 shared cores: 1 writer ~0.6x the in-process daemon's CPU per 1k tokens (18.0 against
    30.7 ms), delivered/simulated 0.998 against 0.991. The bound 0.8x leaves room for a noisy run; a writer
    path that moved no work (every stream written in process again) or added per-token work in the main
    process fails it. Both figures are per-token CPU of the same machine in the same test: a slow day
    scales both."""
    (inproc, _), (writer, lines) = writer_runs[0], writer_runs[1]
    assert writer["errors"] == 0 and inproc["errors"] == 0
    assert writer["client_nice"] == inproc["client_nice"] == 10, (writer, inproc)
    assert any(line.startswith("server CPU per 1k tokens: ") and " at nice 10, " in line for line in lines), lines
    assert writer["ratio"] >= 0.9, writer
    assert writer["roles"]["writer"]["processes"] == 1, writer["roles"]
    assert writer["roles"]["writer"]["ms_per_1k_tokens"] > 0, writer["roles"]
    assert any(line.startswith("writer process CPU per 1k tokens: ") for line in lines), lines
    engine_with_writer = writer["roles"]["engine"]["ms_per_1k_tokens"]
    engine_in_process = inproc["roles"]["engine"]["ms_per_1k_tokens"]
    assert engine_with_writer <= 0.8 * engine_in_process, (engine_with_writer, engine_in_process)
