"""The response cache's store: generations by key, bounded by bytes (LRU) and by age (TTL).

Loop thread only. An entry is the generation's final, whole Delta (text, token ids, finish reason,
usage): format-free, so a hit can be answered as JSON or replayed as a stream. Keys carry the tenant
first, so nothing is ever shared across tenants; the caller builds them (inferd.cache.keys).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from inferd.types import Delta

ENTRY_OVERHEAD_BYTES = 600        # the key (tenant, 32-byte digest), the Delta, its Usage and the dict slot
TOKEN_ID_BYTES = 36               # a Python int in a list: the pointer and the int object


LOGPROB_BYTES = 120               # a TokenLogprob: the struct, its int, its float, its (empty) tuple, a list slot
ALTERNATIVE_BYTES = 140           # one (token id, logprob) pair of its alternatives


def entry_bytes(delta: Delta) -> int:
    """What an entry costs in memory, about: keys are digests, so this bounds the process's memory."""
    size = ENTRY_OVERHEAD_BYTES + len(delta.text.encode()) + 49 + TOKEN_ID_BYTES * len(delta.token_ids)
    if delta.logprobs is not None or delta.prompt_logprobs is not None:   # requests that asked for them
        entries = [e for e in (*(delta.logprobs or ()), *(delta.prompt_logprobs or ())) if e is not None]
        size += LOGPROB_BYTES * len(entries) + ALTERNATIVE_BYTES * sum(len(e.top) for e in entries)
    return size


class ResponseCache:
    def __init__(self, max_bytes: int, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, int, Delta]] = OrderedDict()   # key -> (stored, bytes, delta)
        self.bytes = 0
        self.evictions = 0             # hits and misses are counted where they are answered (metrics)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Delta | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        stored, size, delta = entry
        if self._clock() - stored > self.ttl_s:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return delta

    def put(self, key: Hashable, delta: Delta) -> None:
        size = entry_bytes(delta)
        if size > self.max_bytes:
            return                      # larger than the whole cache: never stored
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (self._clock(), size, delta)
        self.bytes += size
        while self.bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.evictions += 1

    def sweep(self) -> int:
        """Drop every entry past its TTL (text must not outlive it in memory); how many went."""
        now = self._clock()
        old = [k for k, (stored, _, _) in self._entries.items() if now - stored > self.ttl_s]
        for key in old:
            self._drop(key)
        return len(old)

    def resize(self, max_bytes: int, ttl_s: float) -> None:
        """A reload: new bounds, entries kept (the least recently used go if it shrank)."""
        self.max_bytes, self.ttl_s = max_bytes, ttl_s
        while self.bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))
            self.evictions += 1

    def retain_tenants(self, keep) -> int:
        """Drop the entries of every tenant for which `keep(tenant)` is false (it opted out); how many."""
        gone = [k for k in self._entries if not keep(k[0])]
        for key in gone:
            self._drop(key)
        return len(gone)

    def _drop(self, key: Hashable) -> None:
        _, size, _ = self._entries.pop(key)
        self.bytes -= size
