"""KV block bookkeeping on integer ids: reference counts and a prefix cache of full blocks.

Checks come paired with their action (`can_allocate`/`allocate`, `can_append`/`append`):
the caller asks first and decides what to do when there is no room (the scheduler preempts);
an action called without room raises instead of half-applying.

Prefix cache: a full block whose K/V has been computed is registered under the chained hash of
its tokens (the first link salted per tenant, see sequence.prefix_salt), so a later sequence
with the same prefix reuses it by reference. Freed blocks that carry a hash stay findable until
they are evicted for reuse, least recently freed first; blocks without a hash are reused first.
`prefix_caching=False` (the sim: it has no KV contents to share) finds and registers nothing.

Fork: a sequence whose prompt another one has already computed (the `n` choices of one prompt)
takes that one's full blocks by reference and a copy of its last partial block (copy-on-write: the
two will write different tokens after the prompt), so it computes only its prompt's last token.
"""
from __future__ import annotations

from collections import OrderedDict, deque

from inferd.engine.base import blocks_for
from inferd.engine.sequence import Sequence


class BlockManagerError(RuntimeError):
    """An action was called without room (a bug in the caller: ask can_* first)."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self._free_plain: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()   # oldest freed first

    # -- queries -----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (including cached ones it would evict)."""
        return len(self._free_plain) + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._free_cached)

    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def lookup_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding seq's leading full blocks. Pure lookup: nothing changes.

        The block holding the last token is never reused even when cached: at least one token
        must be computed to produce the logits for the next one.
        """
        # A prompt whose every position's logits are wanted is computed whole, as vLLM v1 does
        # (KVCacheManager.get_computed_blocks skips its lookup for them).
        if not self.prefix_caching or seq.needs_prompt_logits:
            return []
        usable = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for block_hash in seq.full_block_hashes(self.block_size)[:usable]:
            block_id = self.hash_to_block.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    # -- a sequence without blocks: first admission or recompute after preemption -----------
    def can_allocate(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> bool:
        """Room for the cached prefix plus blocks for `num_new_tokens` tokens after it."""
        new_blocks = self.blocks_needed(len(cached) * self.block_size + num_new_tokens) - len(cached)
        # cached blocks nobody holds sit in the free pool: taking them shrinks it
        idle_hits = sum(1 for b in cached if self.ref_counts[b] == 0)
        return new_blocks <= self.num_free_blocks - idle_hits

    def allocate(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> None:
        if seq.block_table:
            raise BlockManagerError(f"{seq.request_id}: allocate on a sequence that holds blocks")
        if not self.can_allocate(seq, cached, num_new_tokens):
            raise BlockManagerError(f"{seq.request_id}: no room for {num_new_tokens} tokens")
        for block_id in cached:
            if self.ref_counts[block_id] == 0:
                del self._free_cached[block_id]
            self.ref_counts[block_id] += 1
        table = list(cached)
        for _ in range(self.blocks_needed(len(cached) * self.block_size + num_new_tokens) - len(cached)):
            table.append(self._take_free_block())
        seq.block_table = table
        seq.num_computed_tokens = len(cached) * self.block_size
        seq.num_registered_blocks = len(cached)

    # -- a sequence started from another's computed prompt (fork) ----------------------------
    def can_fork(self) -> bool:
        """A fork always takes one new block: the copy of the partial block, or a fresh one."""
        return self.num_free_blocks >= 1

    def fork(self, src: Sequence, dst: Sequence, num_tokens: int) -> tuple[int, int] | None:
        """`dst` (holding nothing) gets `src`'s K/V of its first `num_tokens` tokens: the full blocks
        shared, the partial one copied into a new block, which also has room for dst's next token.
        Returns (source block, new block) whose K/V the engine must copy before its next forward pass,
        or None when `num_tokens` ends on a block boundary (nothing to copy)."""
        if dst.block_table:
            raise BlockManagerError(f"{dst.request_id}: fork into a sequence that holds blocks")
        if num_tokens > src.num_computed_tokens:
            raise BlockManagerError(f"{src.request_id}: fork of {num_tokens} tokens, {src.num_computed_tokens} computed")
        if not self.can_fork():
            raise BlockManagerError(f"{dst.request_id}: no room to fork")
        full = num_tokens // self.block_size
        shared = src.block_table[:full]
        for block_id in shared:
            self.ref_counts[block_id] += 1
        new = self._take_free_block()
        dst.block_table = [*shared, new]
        dst.num_computed_tokens = num_tokens
        dst.num_registered_blocks = full
        return (src.block_table[full], new) if num_tokens % self.block_size else None

    # -- a sequence that holds blocks: next prefill chunk or a decode token ---------------
    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        needed = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return needed <= 0 or needed <= self.num_free_blocks

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        needed = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if needed <= 0:
            return
        if needed > self.num_free_blocks:
            raise BlockManagerError(f"{seq.request_id}: no room for {num_new_tokens} more tokens")
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Offer seq's newly completed full blocks to the prefix cache (after their K/V is written)."""
        if not self.prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if num_full <= seq.num_registered_blocks:
            return
        hashes = seq.full_block_hashes(self.block_size)
        for i in range(seq.num_registered_blocks, num_full):
            block_id, block_hash = seq.block_table[i], hashes[i]
            # a block computed twice (two sequences prefilling the same prefix at once) stays
            # private to its owner: the first one registered is the one the cache hands out
            if block_hash not in self.hash_to_block and self.block_hash[block_id] is None:
                self.hash_to_block[block_hash] = block_id
                self.block_hash[block_id] = block_hash
        seq.num_registered_blocks = num_full

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks. Tail blocks are released first so they are evicted first."""
        for block_id in reversed(seq.block_table):
            count = self.ref_counts[block_id] - 1
            if count < 0:
                raise BlockManagerError(f"block {block_id} freed more often than taken")
            self.ref_counts[block_id] = count
            if count == 0:
                if self.block_hash[block_id] is not None:
                    self._free_cached[block_id] = None
                else:
                    self._free_plain.append(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0

    def _take_free_block(self) -> int:
        if self._free_plain:
            block_id = self._free_plain.popleft()
        elif self._free_cached:
            block_id, _ = self._free_cached.popitem(last=False)
            del self.hash_to_block[self.block_hash[block_id]]  # type: ignore[index]
            self.block_hash[block_id] = None
        else:
            raise BlockManagerError("no free KV block")
        self.ref_counts[block_id] = 1
        return block_id
