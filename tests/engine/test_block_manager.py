"""BlockManager on integers only: allocation, reference counts, prefix cache, tenant salt, LRU."""
from __future__ import annotations

import pytest

from inferd.engine.block_manager import BlockManager, BlockManagerError
from inferd.engine.sequence import Sequence, prefix_salt

BS = 4


def seq(tokens, rid="r", tenant="t") -> Sequence:
    return Sequence(rid, list(tokens), salt=prefix_salt(tenant))


def admit(bm: BlockManager, s: Sequence) -> list[int]:
    """Allocate the whole sequence (cached prefix + the rest), run it, register its full blocks."""
    cached = bm.lookup_prefix(s)
    remaining = s.num_tokens - len(cached) * BS
    assert bm.can_allocate(s, cached, remaining)
    bm.allocate(s, cached, remaining)
    s.num_computed_tokens = s.num_tokens
    bm.register_computed_blocks(s)
    return cached


def test_allocate_takes_blocks_for_every_token_and_free_returns_them():
    bm = BlockManager(8, BS)
    s = seq(range(10))                      # 10 tokens -> 3 blocks
    admit(bm, s)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3
    assert bm.num_free_blocks == 5
    assert all(bm.ref_counts[b] == 1 for b in s.block_table)
    bm.free(s)
    assert bm.num_free_blocks == 8 and s.block_table == [] and s.num_computed_tokens == 0


def test_can_allocate_refuses_beyond_the_pool_and_allocate_without_room_raises():
    bm = BlockManager(2, BS)
    s = seq(range(9))                       # needs 3 blocks
    assert not bm.can_allocate(s, [], 9)
    with pytest.raises(BlockManagerError):
        bm.allocate(s, [], 9)
    assert bm.num_free_blocks == 2 and s.block_table == []


def test_append_grows_the_table_only_when_a_block_fills():
    bm = BlockManager(4, BS)
    s = seq(range(4))
    admit(bm, s)
    assert len(s.block_table) == 1
    s.token_ids.append(99)                  # a decode token: position 4 needs a second block
    assert bm.can_append(s, 1)
    bm.append(s, 1)
    assert len(s.block_table) == 2
    s.num_computed_tokens += 1
    s.token_ids.append(100)
    bm.append(s, 1)                         # position 5 fits in the second block
    assert len(s.block_table) == 2 and bm.num_free_blocks == 2


def test_can_append_refuses_when_the_pool_is_empty():
    bm = BlockManager(1, BS)
    s = seq(range(4))
    admit(bm, s)
    s.token_ids.append(5)
    assert not bm.can_append(s, 1)
    with pytest.raises(BlockManagerError):
        bm.append(s, 1)


def test_repeated_prompt_reuses_full_blocks_and_counts_references():
    bm = BlockManager(16, BS)
    a = seq(range(10), "a")
    admit(bm, a)
    b = seq(range(10), "b")
    cached = admit(bm, b)
    assert cached == a.block_table[:2]      # two full blocks shared; the partial third is private
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.ref_counts[x] for x in cached] == [2, 2]
    bm.free(a)
    assert [bm.ref_counts[x] for x in cached] == [1, 1]
    assert bm.num_free_blocks == 16 - 3


def test_last_full_block_is_not_reused_when_the_whole_prompt_is_cached():
    bm = BlockManager(16, BS)
    admit(bm, seq(range(8), "a"))
    b = seq(range(8), "b")
    cached = bm.lookup_prefix(b)
    assert len(cached) == 1                 # 8 tokens = 2 full blocks, but the second must be computed


def test_prefix_match_stops_at_the_first_differing_block():
    bm = BlockManager(16, BS)
    admit(bm, seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], "a"))
    b = seq([1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12, 13], "b")
    assert len(bm.lookup_prefix(b)) == 1
    # same third block content after a different second block is not a hit (hashes are chained)
    assert bm.lookup_prefix(seq([9, 9, 9, 9, 5, 6, 7, 8, 9, 10, 11, 12, 13], "c")) == []


def test_tenants_never_share_blocks():
    bm = BlockManager(16, BS)
    admit(bm, seq(range(12), "a", tenant="acme"))
    assert bm.lookup_prefix(seq(range(12), "b", tenant="globex")) == []
    assert len(bm.lookup_prefix(seq(range(12), "c", tenant="acme"))) == 2


def test_freed_cached_block_stays_findable_until_evicted():
    bm = BlockManager(4, BS)
    a = seq(range(9), "a")                  # 3 blocks, two of them full and cached
    admit(bm, a)
    full = a.block_table[:2]
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_free_blocks == 2
    b = seq(range(9), "b")
    assert bm.lookup_prefix(b) == full
    cached = admit(bm, b)
    assert cached == full and bm.num_free_blocks == 1


def test_eviction_prefers_plain_blocks_then_least_recently_freed():
    bm = BlockManager(4, BS)
    a = seq([1] * 4 + [0], "a")
    b = seq([2] * 4 + [0], "b")
    admit(bm, a)                            # a: 1 cached full block + 1 partial
    admit(bm, b)                            # b: same; the pool is now full
    bm.free(a)                              # freed first: least recently freed
    bm.free(b)
    # a new 2-block sequence takes the two plain (partial) blocks: both prefixes survive
    c = seq([3] * 8, "c")
    admit(bm, c)
    assert len(bm.lookup_prefix(seq([1] * 4 + [0]))) == 1
    assert len(bm.lookup_prefix(seq([2] * 4 + [0]))) == 1
    # one more block must evict a cached one: a's, freed before b's
    d = seq([4] * 2, "d")
    admit(bm, d)
    assert bm.lookup_prefix(seq([1] * 4 + [0])) == []
    assert len(bm.lookup_prefix(seq([2] * 4 + [0]))) == 1


def test_a_sequence_frees_its_tail_first_so_the_prefix_outlives_it():
    bm = BlockManager(3, BS)
    a = seq(range(12), "a")                 # 3 full blocks, all cached once computed
    admit(bm, a)
    bm.free(a)
    admit(bm, seq([9] * 4, "x"))            # evicts exactly one cached block: the tail
    assert len(bm.lookup_prefix(seq(list(range(12)) + [5], "b"))) == 2


def test_reusing_idle_cached_blocks_shrinks_the_room_for_new_ones():
    bm = BlockManager(3, BS)
    a = seq(range(9), "a")                  # 3 blocks: the whole pool
    admit(bm, a)
    bm.free(a)
    b = seq(list(range(8)) + [1, 2, 3, 4, 5], "b")   # 2 cached blocks + needs 2 more: 4 > 3
    cached = bm.lookup_prefix(b)
    assert len(cached) == 2
    assert not bm.can_allocate(b, cached, b.num_tokens - 8)
    assert bm.can_allocate(b, cached, 4)    # cached prefix + one new block


def test_fork_shares_full_blocks_and_copies_the_partial_one_into_a_new_block():
    bm = BlockManager(8, BS)
    src = seq(range(10), rid="src")
    admit(bm, src)
    dst = seq(range(10), rid="dst")
    assert bm.fork(src, dst, 9) == (src.block_table[2], dst.block_table[2])
    assert dst.block_table[:2] == src.block_table[:2] and dst.num_computed_tokens == 9
    assert [bm.ref_counts[b] for b in dst.block_table] == [2, 2, 1]
    bm.free(src)
    assert [bm.ref_counts[b] for b in dst.block_table] == [1, 1, 1]
    aligned = seq(range(9), rid="aligned")
    assert bm.fork(dst, aligned, 8) is None and len(aligned.block_table) == 3
    with pytest.raises(BlockManagerError):
        bm.fork(dst, aligned, 8)                     # it holds blocks now
