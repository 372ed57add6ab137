"""bench/embeddings_flood.py as a smoke test: tiny phases, the report's shape, no latency bounds.

The numbers themselves are the bench's job (a 2-core machine under a flood is too noisy for a test to
bound them); this checks that it runs end to end against the real daemon, the config it writes passes
check-config, both phases measure chat TTFT, the flood is answered and counted, and the daemon's
/metrics deltas are there to diagnose from.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# A benchmark: run by `pytest -m bench` (.ci/run does, after the default run), never the default run.
pytestmark = pytest.mark.bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "embeddings_flood.py"


@pytest.mark.slow
def test_the_bench_reports_chat_ttft_alone_and_under_an_embeddings_flood():
    out = subprocess.run([sys.executable, str(BENCH), "--seconds", "1", "--settle", "0.5", "--warmup", "0.5",
                          "--chat-clients", "2", "--flood-clients", "2", "--inputs", "8", "--max-tokens", "8"],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    report, end = json.JSONDecoder().raw_decode(out.stdout)
    assert "ok" in report["check_config"][0]
    for name in ("alone", "flood"):
        phase = report[name]
        assert phase["chat_requests"] > 0 and phase["chat_statuses"] == {"200": phase["chat_requests"]}, phase
        assert 0 < phase["chat_ttft_p50_ms"] <= phase["chat_ttft_p99_ms"] <= phase["chat_e2e_p99_ms"], phase
        assert phase["daemon_cpu"] > 0 and phase["client_cpu"] > 0
        assert phase["daemon_metrics"]["chat"]["time_to_first_token"]["count"] > 0
    flood = report["flood"]["flood"]
    assert flood["requests"] > 0 and set(flood["statuses"]) <= {"200", "429", "503", "504"}, flood
    assert flood["inputs_per_s"] > 0 and flood["inputs_computed_per_s"] >= flood["inputs_per_s"] * 0.5, flood
    assert 50 <= flood["tokens_per_input"] <= 150, flood          # ~100 tokens per input, as asked
    assert report["flood"]["daemon_metrics"]["embed"]["embedding_batch_size"]["count"] > 0
    assert "flood" not in report["alone"]
    assert report["ttft_p99_ratio"] == pytest.approx(
        report["flood"]["chat_ttft_p99_ms"] / report["alone"]["chat_ttft_p99_ms"], rel=1e-2)
    summary = out.stdout[end:]
    assert "verdict: chat p99 TTFT under the embeddings flood is x" in summary
