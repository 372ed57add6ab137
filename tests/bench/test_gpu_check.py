"""bench/gpu_check.py on the CPU path (what runs where there is no GPU): every phase finishes at the small
shape and the summary names each figure; and the Llama-3-8B shape it measures against is the real one.
Shape and bookkeeping only: no figure is bounded here (they belong to the GPU run, docs/gpu.md)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.scripts import load_script

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5")

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def load(name: str):
    return load_script(name)


def test_the_8b_shape_reads_llama_3_8b_weights_per_step_and_its_tokenizer_has_every_id(tmp_path):
    models = load("gpu_models")
    shape = models.SHAPES["8b"]
    # Llama-3-8B: 8,030,261,248 parameters, of which the 128256 x 4096 embedding table is read a row per sequence
    assert shape.decode_weight_bytes(1, 0) == 8_030_261_248 - 128256 * 4096
    assert shape.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2
    artifact = models.dummy_artifact(tmp_path, "dummy-8b", shape)
    from inferd.engine.tokenization import HFTokenizer

    tokenizer = HFTokenizer.from_dir(artifact)
    assert tokenizer.backend_tokenizer.get_vocab_size() == 128256
    assert set(tokenizer.eos_token_ids) == {128001, 128009}
    assert models.dummy_artifact(tmp_path, "dummy-8b", shape) == artifact       # content-addressed: reused


@pytest.mark.bench
@pytest.mark.slow
def test_every_phase_runs_on_the_cpu_path_and_the_summary_names_each_figure():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--device", "cpu", "--node-seconds", "2",
                          "--node-warmup", "2"], check=False, capture_output=True, text=True, timeout=400, env=env)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert lines[0].startswith("gpu_check: CPU path (no CUDA device")
    names = {line.split(":", 1)[0] for line in lines[1:]}
    for name in ("parity", "parity greedy float32", "bandwidth", "batch 1", "batch 8", "direct streams",
                 "daemon/direct tokens/s", "added ITL p99", "disconnect", "writers", "writers daemon/direct tokens/s",
                 "writers disconnect", "node.py", "torch speculative speedup, repetitive",
                 "torch int8 weight bytes / float", "phases"):
        assert name in names, (name, lines)
    assert "parity: ok" in out.stdout and "parity greedy float32: equal" in out.stdout
    assert "writers: 1 SSE writer process(es)" in out.stdout
    assert lines[-1].startswith("phases: 6 ok, 0 failed")
