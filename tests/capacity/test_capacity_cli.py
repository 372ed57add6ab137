from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys

from inferd.capacity import capacity_main
from inferd.engine.sim import PROFILES

from tests.capacity.helpers import parse

EXAMPLE = ("--rate", "50", "--prompt-mean", "1500", "--prompt-p95", "4000", "--output-mean", "300",
           "--ttft-p95-ms", "1000", "--itl-p99-ms", "50", "--zones", "3")


def test_prints_both_tables_for_the_profiles_asked(capsys):
    assert capacity_main(parse(*EXAMPLE, "--profile", "llama3-8b-h100", "--profile", "llama3-70b-4xh100")) == 0
    out = capsys.readouterr().out
    assert out.startswith("demand: 50 req/s; prompt mean 1500 / p95 4000 tokens")
    assert "survives losing 1 of 3 zones" in out and "binds" in out
    assert "needed if prefill and decode time-share the same GPUs" in out
    assert out.count("llama3-70b-4xh100") == 3 and "llama3-8b-h100-fp8" not in out


def test_json_output_is_one_document_with_a_plan_per_profile(capsys):
    assert capacity_main(parse(*EXAMPLE, "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {p["profile"] for p in doc["plans"]} >= {"llama3-8b-h100", "llama3-70b-4xh100"}
    plan = next(p for p in doc["plans"] if p["profile"] == "llama3-70b-4xh100")
    assert plan["gpus"] == 4 * plan["replicas"] and len(plan["zone_split"]) == 3


def test_bad_input_exits_2_with_a_message_and_no_table(capsys):
    assert capacity_main(parse("--rate", "5", "--prompt-mean", "100", "--output-mean", "100", "--zones", "0")) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("inferd capacity: zones (--zones) must be")


def test_an_itl_target_no_batch_meets_exits_2_naming_the_batch_1_step(capsys):
    argv = ("--rate", "5", "--prompt-mean", "100", "--output-mean", "100", "--itl-p99-ms", "1")
    assert capacity_main(parse(*argv, "--profile", "llama3-8b-h100")) == 2
    step_ms = PROFILES["llama3-8b-h100"].decode_step_time(1, 150) * 1e3    # context: 100 + 100 / 2
    err = capsys.readouterr().err
    assert f"llama3-8b-h100: no batch meets itl_p99_ms=1: the profile's batch-1 step is {step_ms:.1f} ms" in err


def test_profiles_that_cannot_meet_the_slo_are_listed_beside_those_that_can(capsys):
    argv = ("--rate", "5", "--prompt-mean", "100", "--output-mean", "100", "--itl-p99-ms", "5")
    assert capacity_main(parse(*argv, "--profile", "llama3-8b-h100", "--profile", "llama3-8b-h100-fp8")) == 0
    out = capsys.readouterr().out
    assert "not feasible at any replica count:\n  llama3-8b-h100: no batch meets itl_p99_ms=5" in out


def test_measured_curves_replace_the_sim_and_unknown_profiles_are_named(tmp_path, capsys):
    path = tmp_path / "curves.json"
    path.write_text(json.dumps({"profiles": {"a100": {"gpus_per_replica": 2, "prefill_tokens_per_s": 8000,
                                                       "decode": [{"batch": 1, "step_s": 0.02}]}}}))
    base = ("--rate", "1", "--prompt-mean", "100", "--output-mean", "100", "--curves", str(path))
    assert capacity_main(parse(*base)) == 0
    assert re.search(r"^a100 +measured \(curves.json\) +2 +8,000 ", capsys.readouterr().out, re.M)
    assert capacity_main(parse(*base, "--profile", "h100")) == 2
    assert "profile(s) h100 not in" in capsys.readouterr().err


def test_the_help_documents_every_input():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parse("--help")
    text = out.getvalue()
    for word in ("--rate", "--prompt-mean", "--prompt-p95", "--output-mean", "--output-p95", "--ttft-p95-ms",
                 "--itl-p99-ms", "--target-utilisation", "--zones", "--demand", "--curves", "--profile", "--json",
                 "MEAN prompt", "P95 prompt", "ceil(replicas x Z / (Z-1))", "buckets"):
        assert word in text, word


def test_importing_the_cli_does_not_import_the_engine():
    code = ("import sys, inferd.capacity; "
            "print(sorted(m for m in ('inferd.engine', 'numpy', 'aiohttp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_inferd_capacity_runs_from_the_command_line():
    out = subprocess.run([sys.executable, "-m", "inferd", "capacity", *EXAMPLE, "--profile", "llama3-8b-h100",
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)
    assert "--itl-p99-ms" in subprocess.run([sys.executable, "-m", "inferd", "capacity", "--help"],
                                            capture_output=True, text=True, timeout=60).stdout
