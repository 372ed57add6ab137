"""The memory a version will hold, estimated before loading it, against what its loaded engine says it holds."""
from __future__ import annotations

import pytest

from inferd.config import TorchConfig
from inferd.config.root import ModelConfig, ServerConfig
from inferd.engine.reference.engine import ReferenceEngine
from inferd.engine.torch.engine import TorchEngine
from inferd.models.footprint import estimate_bytes
from tests.engine.backends import started_engines

BLOCKS = 64


@pytest.fixture(params=["float", "int8"])
def artifact(request, tiny_artifact, int8_artifact):
    return tiny_artifact if request.param == "float" else int8_artifact


async def test_the_reference_estimate_is_what_the_loaded_engine_holds_float_or_int8(artifact):
    estimate = estimate_bytes("tiny", ModelConfig(num_kv_blocks=BLOCKS), ServerConfig(), artifact)
    async with started_engines(lambda: ReferenceEngine(artifact, num_kv_blocks=BLOCKS)) as make:
        engine = await make()
        assert estimate == engine.memory_bytes()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
async def test_the_torch_estimate_is_within_two_percent_of_what_the_loaded_engine_holds(artifact, dtype):
    model = ModelConfig(backend="torch", num_kv_blocks=BLOCKS, torch=TorchConfig(device="cpu", dtype=dtype))
    estimate = estimate_bytes("tiny", model, ServerConfig(), artifact)
    async with started_engines(lambda: TorchEngine(artifact, num_kv_blocks=BLOCKS, device="cpu", dtype=dtype)) as make:
        engine = await make()
        assert estimate == pytest.approx(engine.memory_bytes(), rel=0.02)


def test_an_int8_versions_weights_are_estimated_at_under_a_third_of_its_float_versions(tiny_artifact, int8_artifact):
    model = ModelConfig(num_kv_blocks=1)
    kv = estimate_bytes("tiny", ModelConfig(num_kv_blocks=2), ServerConfig(), tiny_artifact) - \
        estimate_bytes("tiny", model, ServerConfig(), tiny_artifact)          # one block's K and V
    base, int8 = (estimate_bytes("tiny", model, ServerConfig(), a) - kv for a in (tiny_artifact, int8_artifact))
    assert int8 <= 0.3 * base
