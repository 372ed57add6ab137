"""A paged KV pool with prefix reuse, counted in blocks (the C++ KV cache manager's bookkeeping).

Full prompt blocks are content-hashed (chained, salted by cache_salt) and shared; a block whose
last user finished stays cached (evictable, LRU) until its space is needed.
"""
from __future__ import annotations

import collections
import hashlib


def block_hashes(token_ids: list[int], tokens_per_block: int, salt: str | None) -> list[bytes]:
    """Chained hashes of the full blocks of a prompt, keeping at least one token to compute."""
    hashes: list[bytes] = []
    prev = hashlib.sha256((salt or "").encode()).digest()
    full = (len(token_ids) - 1) // tokens_per_block
    for b in range(full):
        chunk = token_ids[b * tokens_per_block:(b + 1) * tokens_per_block]
        prev = hashlib.sha256(prev + repr(chunk).encode()).digest()
        hashes.append(prev)
    return hashes


class KvPool:
    def __init__(self, num_blocks: int, tokens_per_block: int, enable_block_reuse: bool) -> None:
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.reuse = enable_block_reuse
        self.refs: dict[bytes, int] = {}
        self.cached: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.private = 0
        self.alloc_total = self.alloc_new = self.reused = self.missed = 0

    @property
    def used(self) -> int:
        return len(self.refs) + self.private

    @property
    def free(self) -> int:
        return self.num_blocks - self.used

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.tokens_per_block)

    def matched(self, hashes: list[bytes]) -> tuple[int, int]:
        """(leading blocks found in use by others, leading blocks found cached-free)."""
        in_use = cached = 0
        if not self.reuse:
            return 0, 0
        for h in hashes:
            if h in self.refs:
                in_use += 1
            elif h in self.cached:
                cached += 1
            else:
                break
        return in_use, cached

    def _make_room(self) -> None:
        if self.num_blocks - self.used - len(self.cached) <= 0:
            if not self.cached:
                raise RuntimeError("[TensorRT-LLM][ERROR] no free KV cache blocks")
            self.cached.popitem(last=False)

    def acquire_prompt(self, hashes: list[bytes]) -> tuple[int, list[bytes], int]:
        """Take the hashed prompt blocks: (blocks reused, hashes now held, blocks held privately)."""
        reused, held, private = 0, [], 0
        matching = self.reuse
        for h in hashes:
            self.alloc_total += 1
            if matching and (h in self.refs or h in self.cached):
                reused += 1
                self.reused += 1
                self.cached.pop(h, None)
                self.refs[h] = self.refs.get(h, 0) + 1
                held.append(h)
                continue
            matching = False
            self.missed += 1
            self.alloc_new += 1
            self._make_room()
            if self.reuse and h not in self.refs:
                self.refs[h] = 1
                held.append(h)
            else:
                self.private += 1
                private += 1
        return reused, held, private

    def acquire_private(self, n: int) -> None:
        for _ in range(n):
            self._make_room()
            self.private += 1
            self.alloc_total += 1
            self.alloc_new += 1

    def release(self, held: list[bytes], private_blocks: int) -> None:
        self.private -= private_blocks
        for h in held:
            count = self.refs[h]
            if count > 1:
                self.refs[h] = count - 1
            else:
                del self.refs[h]
                if self.reuse:
                    self.cached[h] = None

    def stats(self) -> dict:
        total = self.reused + self.missed
        return {"maxNumBlocks": self.num_blocks, "freeNumBlocks": self.free, "usedNumBlocks": self.used,
                "tokensPerBlock": self.tokens_per_block, "allocTotalBlocks": self.alloc_total,
                "allocNewBlocks": self.alloc_new, "reusedBlocks": self.reused, "missedBlocks": self.missed,
                "cacheHitRate": (self.reused / total) if total else 0.0}
