"""Int8 weight-only models: built from a float artifact, a quarter of its memory, close to its predictions."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.artifacts import read_manifest
from inferd.engine.reference import quantize_artifact
from inferd.artifacts.manifest import ArtifactError
from inferd.engine.reference.engine import ReferenceEngine
from inferd.engine.reference.int8 import Int8Matrix
from inferd.engine.reference.model import LlamaModel
from inferd.engine.reference.scoring import compare
from inferd.engine.reference.weights import Checkpoint, WeightsError
from inferd.types import GenerationRequest, SamplingParams
from tests.engine.backends import started_engines

TEXTS = ["the quick brown fox jumps over the lazy dog", "one of the most common words in the language is the",
         "there was a time when all of them were at home and they could not be found", "what do you think about it",
         "we said that we would be there by the time the sun went down over the hills"]


def test_per_row_quantization_reconstructs_each_row_within_half_a_step():
    w = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32) * np.linspace(0.01, 3, 64)[:, None]
    q = Int8Matrix.quantize(w)
    assert np.all(np.abs(q.dequantize() - w) <= q.scale[:, None] / 2 + 1e-7)
    x = np.random.default_rng(1).standard_normal((5, 48)).astype(np.float32)
    np.testing.assert_allclose(q.linear(x), x @ q.dequantize().T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(q.rows(np.array([3, 0])), q.dequantize()[[3, 0]])


def test_the_int8_version_is_a_pinned_version_of_the_same_name_with_its_precision_recorded(int8_artifact,
                                                                                           tiny_artifact):
    manifest = read_manifest(int8_artifact)
    assert manifest.name == "tiny" and manifest.build == {"precision": "int8", "quantized_from": tiny_artifact.name}
    assert (int8_artifact.parent / "LATEST").read_text().strip() == tiny_artifact.name      # LATEST unchanged
    with pytest.raises(ArtifactError, match="already int8"):
        quantize_artifact(int8_artifact, int8_artifact.parent.parent)


def test_int8_holds_a_third_of_the_float_weights_and_predicts_what_float_does(int8_artifact, tiny_artifact,
                                                                            tiny_tokenizer):
    base, int8 = LlamaModel.from_pretrained(tiny_artifact), LlamaModel.from_pretrained(int8_artifact)
    assert int8.weight_bytes() <= 0.3 * base.weight_bytes()
    agreement, clear, perplexity = compare(base, int8, [tiny_tokenizer.encode(t) for t in TEXTS])
    assert agreement >= 0.9 and clear >= 0.98 and abs(perplexity - 1) <= 0.02, (agreement, clear, perplexity)


def test_a_float_only_reader_refuses_int8_weights_rather_than_misreading_them(int8_artifact):
    with pytest.raises(WeightsError, match="int8-quantized"):
        Checkpoint(int8_artifact).get("model.layers.0.self_attn.q_proj.weight")


async def test_the_engine_serves_an_int8_artifact_and_says_so(int8_artifact):
    async with started_engines(lambda: ReferenceEngine(int8_artifact, num_kv_blocks=64)) as make:
        engine = await make()
        assert engine.info.precision == "int8"
        prompt = tuple(engine.tokenizer.encode(TEXTS[0]))
        result = await engine.submit(GenerationRequest(request_id="q", prompt_token_ids=prompt, sampling=SamplingParams(
            max_tokens=8, temperature=0.0, ignore_eos=True))).collect()
        assert len(result.token_ids) == 8
