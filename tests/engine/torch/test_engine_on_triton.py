"""The torch engine with the Triton decode kernel CUDA runs (under Triton's CPU interpreter, in a subprocess:
triton_engine_run.py) generates what the reference engine generates: the kernel, the graph ladder's padded
buffers and the device sampler together, end to end, before any GPU sees them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from inferd.engine.reference.engine import ReferenceEngine  # noqa: E402
from tests.engine.torch.triton_engine_run import SHAPE, greedy_outputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TEXTS = ["the quick brown fox", "we said", "there was a time when all of them were at home and they could not"]
MAX_TOKENS = 12


async def reference_outputs(artifact: Path, prompts: list[list[int]]) -> list[list[int]]:
    engine = ReferenceEngine(artifact, **SHAPE)
    await engine.start()
    try:
        return await greedy_outputs(engine, prompts, MAX_TOKENS)
    finally:
        await engine.close()


async def test_the_engine_on_the_triton_decode_kernel_generates_what_the_reference_does(tiny_artifact, tiny_tokenizer):
    prompts = [tiny_tokenizer.encode(t) for t in TEXTS]
    argument = json.dumps({"artifact": str(tiny_artifact), "dtype": "float32", "prompts": prompts,
                           "max_tokens": MAX_TOKENS})
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.engine.torch.triton_engine_run", argument], check=False,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == await reference_outputs(tiny_artifact, prompts)
