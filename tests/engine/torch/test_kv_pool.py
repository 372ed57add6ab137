"""KVPool: the paged K/V storage on the device, its scratch block, block copies and sizing."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from inferd.engine.torch.kv_pool import KVPool, KVPoolError, blocks_for_budget

LAYERS, BLOCKS, BLOCK, KV_HEADS, HEAD_DIM = 2, 5, 4, 2, 8


def make_pool(dtype=torch.float32) -> KVPool:
    return KVPool(num_layers=LAYERS, num_blocks=BLOCKS, block_size=BLOCK, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                  dtype=dtype, device="cpu")


def test_a_new_pool_is_zeroed_with_one_scratch_block_past_the_ones_it_hands_out():
    pool = make_pool()
    assert len(pool.k) == len(pool.v) == LAYERS
    assert pool.k[0].shape == (BLOCKS + 1, BLOCK, KV_HEADS, HEAD_DIM) and pool.k[1].dtype == torch.float32
    assert pool.scratch_slot == BLOCKS * BLOCK
    assert all(t.abs().sum() == 0 for t in pool.k + pool.v)
    assert pool.nbytes == (BLOCKS + 1) * KVPool.bytes_per_block(LAYERS, BLOCK, KV_HEADS, HEAD_DIM, torch.float32)


def test_write_stores_each_row_at_its_slot_in_one_layer_only():
    pool = make_pool(torch.bfloat16)
    k = torch.randn(3, KV_HEADS, HEAD_DIM)
    v = torch.randn(3, KV_HEADS, HEAD_DIM)
    pool.write(1, torch.tensor([6, 0, pool.scratch_slot]), k, v)
    assert torch.equal(pool.k[1][1, 2], k[0].bfloat16()) and torch.equal(pool.v[1][0, 0], v[1].bfloat16())
    assert torch.equal(pool.k[1][BLOCKS, 0], k[2].bfloat16())
    assert pool.k[0].abs().sum() == 0 and pool.k[1][2:BLOCKS].abs().sum() == 0


def test_copy_block_copies_k_and_v_in_every_layer():
    pool = make_pool()
    for layer in range(LAYERS):
        pool.k[layer][3] = layer + 1.0
        pool.v[layer][3] = -(layer + 1.0)
    pool.copy_block(3, 0)
    for layer in range(LAYERS):
        assert torch.equal(pool.k[layer][0], pool.k[layer][3]) and torch.equal(pool.v[layer][0], pool.v[layer][3])
    assert pool.k[0][1].abs().sum() == 0
    with pytest.raises(KVPoolError, match="block ids"):
        pool.copy_block(3, BLOCKS)            # the scratch block is no one's


def test_bytes_per_block_counts_k_and_v_of_every_layer_in_the_dtype():
    assert KVPool.bytes_per_block(32, 16, 8, 128, torch.bfloat16) == 2 * 32 * 16 * 8 * 128 * 2
    assert KVPool.bytes_per_block(2, 4, 2, 8, torch.float32) == 2 * 2 * 4 * 2 * 8 * 4


def test_blocks_for_budget_leaves_room_for_the_scratch_block():
    assert blocks_for_budget(10 * 100, 100) == 9
    assert blocks_for_budget(10 * 100 + 99, 100) == 9
    assert blocks_for_budget(100, 100) == 0 and blocks_for_budget(50, 100) == 0 and blocks_for_budget(-5, 100) == 0
    with pytest.raises(KVPoolError):
        blocks_for_budget(100, 0)


@pytest.mark.parametrize("field, value", [("num_blocks", 0), ("block_size", -1), ("head_dim", 2.5)])
def test_a_shape_that_is_not_a_positive_integer_is_refused_by_name(field, value):
    shape = {"num_layers": LAYERS, "num_blocks": BLOCKS, "block_size": BLOCK, "num_kv_heads": KV_HEADS,
             "head_dim": HEAD_DIM}
    with pytest.raises(KVPoolError, match=field):
        KVPool(**{**shape, field: value}, dtype=torch.float32, device="cpu")
    with pytest.raises(KVPoolError, match="dtype"):
        KVPool(**shape, dtype=torch.int8, device="cpu")
