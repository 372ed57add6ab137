"""The KV pool's share of a GPU (inferd.engine.torch.memory), with the device's counters stood in for."""
from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from inferd.engine.reference.config import LlamaConfig  # noqa: E402
from inferd.engine.torch import memory  # noqa: E402
from inferd.engine.torch.kv_pool import KVPool  # noqa: E402
from inferd.engine.torch.model import TorchLlama  # noqa: E402

GiB = 1 << 30
CONFIG = LlamaConfig.from_dict(dict(
    model_type="llama", vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))


@pytest.fixture
def model() -> TorchLlama:
    return TorchLlama.dummy(CONFIG, device="cpu", dtype="float32", seed=0)


def blocks_on(monkeypatch, model, *, free: int, total: int, activations: int = 0, utilization: float = 0.9) -> int:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(memory, "profile_activations", lambda *args: activations)
    return memory.kv_blocks_from_memory(model, block_size=16, utilization=utilization, max_num_tokens=64,
                                        max_batch_size=4, max_model_len=256, graph_max_batch=4)


def per_block() -> int:
    return KVPool.bytes_per_block(2, 16, 2, 16, torch.float32)


def test_an_engine_alone_gets_its_share_less_its_weights_and_working_memory(monkeypatch, model):
    alone = blocks_on(monkeypatch, model, free=79 * GiB, total=80 * GiB, utilization=0.5)
    expected_share = int(80 * GiB * 0.5) - model.weight_bytes()
    assert alone < expected_share // per_block() and alone > (expected_share - GiB) // per_block()


def test_another_engine_on_the_gpu_does_not_shrink_this_ones_share_while_memory_is_free(monkeypatch, model):
    alone = blocks_on(monkeypatch, model, free=79 * GiB, total=80 * GiB, utilization=0.45)
    beside_another = blocks_on(monkeypatch, model, free=43 * GiB, total=80 * GiB, utilization=0.45)
    assert beside_another == alone


def test_the_pool_never_takes_more_than_is_free(monkeypatch, model):
    crowded = blocks_on(monkeypatch, model, free=2 * GiB, total=80 * GiB)
    assert crowded * per_block() < 2 * GiB - memory.MARGIN_BYTES


def test_measured_activations_come_out_of_the_pool(monkeypatch, model):
    lean = blocks_on(monkeypatch, model, free=79 * GiB, total=80 * GiB)
    heavy = blocks_on(monkeypatch, model, free=79 * GiB, total=80 * GiB, activations=4 * GiB)
    assert (lean - heavy) * per_block() == pytest.approx(4 * GiB, rel=0.01)


def test_loads_on_one_device_share_one_lock():
    a, b = memory.device_lock(torch.device("cuda", 0)), memory.device_lock(torch.device("cuda"))
    assert a is b and isinstance(a, type(threading.Lock())) and memory.device_lock(torch.device("cuda", 1)) is not a
