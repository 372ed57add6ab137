"""bench/capacity_curves.py: curves measured by running an engine, read back by the planner.

The sim's measured curve is checked against the roofline curve the planner derives from the same profile
(inferd/capacity/sim_curves.py): two independent routes to one figure, the engine's scheduler and step
loop on one side, the planner's arithmetic on the other. The reference engine's figures are wall time on
a shared CPU, so its test checks the shape of what it writes, never a speed.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from inferd.capacity import capacity_main, load_curves, plan_capacity, sim_curve

from tests.capacity.helpers import demand, parse

BENCH = Path(__file__).resolve().parents[2] / "bench" / "capacity_curves.py"
_spec = importlib.util.spec_from_file_location("capacity_curves", BENCH)
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)


def write(tmp_path: Path, name: str, curve: dict) -> Path:
    path = tmp_path / "curves.json"
    path.write_text(cc.format_curves({"profiles": {name: curve}}), encoding="utf-8")
    return path


async def test_the_measured_sim_curve_agrees_with_the_roofline_the_planner_derives(tmp_path):
    lines: list[str] = []
    measured = await cc.measure_sim("llama3-8b-h100", prompt_len=1500, context=1650, max_batch=64,
                                    max_num_tokens=8192, log=lines.append)
    assert [p["batch"] for p in measured["decode"]] == [1, 2, 4, 8, 16, 32, 64]
    assert measured["gpus_per_replica"] == 1 and measured["max_batch"] == 64
    d = demand(prompt={"mean": 1500}, output={"mean": 300}, slo={"itl_p99_ms": 10})   # decode context 1650
    (from_file,) = load_curves(write(tmp_path, "llama3-8b-h100", measured), d)
    roofline = sim_curve("llama3-8b-h100", d, max_batch_size=64)

    assert from_file.prefill_tokens_per_s == pytest.approx(roofline.prefill_tokens_per_s, rel=0.01)
    for batch, step_s in from_file.decode:                 # the measured points themselves
        assert step_s == pytest.approx(roofline.step_s(batch), rel=1e-3), batch
    for batch in (3, 24, 48):                              # the planner's interpolation between them
        assert from_file.step_s(batch) == pytest.approx(roofline.step_s(batch), rel=0.01), batch

    # and so the plans agree: the ITL target picks the same batch, the loads match
    mine, theirs = plan_capacity(from_file, d), plan_capacity(roofline, d)
    assert mine.decode_batch == theirs.decode_batch
    assert (mine.replicas, mine.colocated_replicas) == (theirs.replicas, theirs.colocated_replicas)
    assert mine.prefill_load == pytest.approx(theirs.prefill_load, rel=0.01)
    assert mine.decode_load == pytest.approx(theirs.decode_load, rel=0.01)
    assert any("prefill" in line for line in lines) and sum("decode step" in line for line in lines) == 7


async def test_the_kv_pool_caps_the_batches_measured_and_max_batch():
    # The toy profile's pool is 337 blocks of 16: 21 sequences at 250 tokens (16 blocks each), 10 at 500.
    lines: list[str] = []
    measured = await cc.measure_sim("tiny", prompt_len=200, context=240, max_batch=32, max_num_tokens=512,
                                    kv_sequence_tokens=500, log=lines.append)
    assert [p["batch"] for p in measured["decode"]] == [1, 2, 4, 8, 16, 21]
    assert measured["max_batch"] == 10
    assert any("holds 21 sequences at this context, not 32" in line for line in lines)


async def test_the_reference_engine_writes_a_curve_the_planner_reads(tiny_artifact, tmp_path):
    measured = await cc.measure_reference(tiny_artifact, prompt_len=32, context=48, max_batch=4, max_num_tokens=64,
                                          decode_steps=3, prefill_steps=2, max_seconds=30)
    assert measured["gpus_per_replica"] == 1 and measured["max_batch"] == 4
    assert "reference engine on tiny@" in measured["description"]
    (curve,) = load_curves(write(tmp_path, "reference-cpu", measured), demand())
    assert [b for b, _ in curve.decode] == [1, 2, 4] and all(s > 0 for _, s in curve.decode)
    assert curve.prefill_tokens_per_s > 0 and curve.source == "measured (curves.json)"


def test_the_script_writes_a_file_inferd_capacity_plans_from(tmp_path, capsys):
    out = tmp_path / "curves.json"
    assert cc.main(["--backend", "sim", "--profile", "llama3-70b-4xh100", "--max-batch", "16",
                    "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["profiles"]["llama3-70b-4xh100"]["gpus_per_replica"] == 4     # its tensor_parallel
    capsys.readouterr()
    assert capacity_main(parse("--curves", str(out), "--rate", "5", "--prompt-mean", "1500",
                               "--output-mean", "300")) == 0
    assert "llama3-70b-4xh100  measured (curves.json)" in capsys.readouterr().out


def test_bad_arguments_and_impossible_measurements_are_refused(capsys):
    with pytest.raises(SystemExit):
        cc.parse_args(["--backend", "reference", "--profile", "tiny"])
    assert "--profile is for --backend sim" in capsys.readouterr().err
    assert cc.main(["--backend", "sim", "--profile", "no-such-gpu"]) == 2
    assert "unknown sim profile 'no-such-gpu'" in capsys.readouterr().err
    # one 8000-token sequence is beyond the toy profile's whole pool (5392 tokens)
    assert cc.main(["--backend", "sim", "--profile", "tiny", "--prompt-len", "100", "--context", "200",
                    "--max-batch", "2", "--max-num-tokens", "256", "--kv-sequence-tokens", "8000"]) == 2
    assert "one sequence of 8000 tokens does not fit the KV pool (337 blocks of 16)" in capsys.readouterr().err
