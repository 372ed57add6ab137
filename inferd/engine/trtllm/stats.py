"""What the TensorRT-LLM backend holds: its requests in flight, their reservations, and the executor's
latest iteration stats, turned into `capacity()` and `stats()`.

Fairness lives in admission, so `capacity()` must keep the executor's own queue empty. With
GUARANTEED_NO_EVICT the executor starts a request only when blocks for prompt + max_tokens fit; we count
the same reservation for every request in flight and, while requests run, also take the executor's
freeNumBlocks (from `get_stats_async`) minus what was submitted since that sample.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from inferd.engine.base import Capacity, EngineInfo, EngineStats, SpeculationStats

if TYPE_CHECKING:
    from inferd.engine.trtllm.stream import TrackedRequest

log = logging.getLogger("inferd.engine.trtllm")


class RequestLedger:
    """Requests from submit until the executor lets them go, and the stats samples. Loop-thread only."""

    def __init__(self, speculating: bool = False) -> None:
        self.requests: dict[str, TrackedRequest] = {}
        # EAGLE on: each iteration's specDecodingStats (numDraftTokens, numAcceptedTokens,
        # numRequestsWithDraftTokens; docs/trtllm-api.md §5) summed, for the inferd_spec_decode_* series
        self._speculating = speculating
        self._spec = [0, 0, 0]
        self.kv_known = asyncio.Event()         # the executor has reported its KV pool size
        self.sample_applied = asyncio.Event()   # set after each stats sample is applied
        self._seq = 0
        self._sample: dict[str, Any] = {}       # the latest iteration stats
        self._sample_seq = -1                   # submissions up to this seq are reflected in _sample
        self._prompt_total = self._gen_total = self._cached_total = 0
        self._tokens_per_s = 0.0

    # -- requests -------------------------------------------------------------------------------------------
    def admit(self, r: TrackedRequest) -> None:
        self._seq += 1
        r.seq = self._seq
        self.requests[r.id] = r
        self._prompt_total += r.prompt_len

    def ended(self, r: TrackedRequest, cached_tokens: int) -> None:
        """The client's stream got its final delta: count what it was served."""
        self._gen_total += r.emitted
        self._cached_total += cached_tokens

    def release(self, r: TrackedRequest) -> None:
        """The executor let the request go: it no longer takes a slot or KV blocks."""
        self.requests.pop(r.id, None)

    # -- stats samples ----------------------------------------------------------------------------------------
    def apply_sample(self, item: dict, info: EngineInfo, step_observer: Callable[[float], None] | None) -> EngineInfo:
        """Take one iteration's stats; returns `info`, updated once the executor reports its KV pool."""
        kv = item.get("kvCacheStats") or {}
        self._sample = item
        self._sample_seq = self._seq
        latency_ms = item.get("iterLatencyMS")
        latency = (latency_ms or 0.0) / 1000.0
        if step_observer is not None and latency_ms is not None:
            try:
                step_observer(latency)
            except Exception:  # metrics must never take the engine down
                log.exception("step_observer failed")
        spec = item.get("specDecodingStats")
        if spec:
            for i, key in enumerate(("numDraftTokens", "numAcceptedTokens", "numRequestsWithDraftTokens")):
                self._spec[i] += int(spec.get(key) or 0)
        ifb = item.get("inflightBatchingStats") or {}
        tokens = (ifb.get("numCtxTokens") or 0) + (ifb.get("numGenRequests") or 0)
        if latency > 0:
            self._tokens_per_s = 0.9 * self._tokens_per_s + 0.1 * (tokens / latency)
        max_blocks, block_size = kv.get("maxNumBlocks"), kv.get("tokensPerBlock")
        if max_blocks and not self.kv_known.is_set():
            changes: dict[str, Any] = {"num_kv_blocks": int(max_blocks)}
            if block_size:
                changes["block_size"] = int(block_size)
            info = msgspec.structs.replace(info, **changes)
            self.kv_known.set()
        self.sample_applied.set()
        return info

    # -- what admission and metrics read ----------------------------------------------------------------------
    def capacity(self, info: EngineInfo) -> Capacity:
        reqs = self.requests
        free = info.num_kv_blocks - sum(r.blocks for r in reqs.values())
        kv = self._sample.get("kvCacheStats") or {}
        sampled_free = kv.get("freeNumBlocks")
        if reqs and sampled_free is not None:
            # The executor's own count, less what admission submitted since that sample was taken.
            since = sum(r.blocks for r in reqs.values() if r.seq > self._sample_seq)
            free = min(free, sampled_free - since)
        free = max(0, free)
        # The executor does not report per-request prefill progress: a request whose first token has
        # not arrived counts its whole prompt as pending (an over-estimate, never an under-report).
        waiting = pending = 0
        for r in reqs.values():
            if r.first_token is None:
                waiting += 1
                pending += r.prompt_len
        return Capacity(free_kv_blocks=free, free_kv_tokens=free * info.block_size, waiting=waiting,
                        free_slots=max(0, info.max_batch_size - len(reqs)), block_size=info.block_size,
                        pending_prefill_tokens=pending)

    def stats(self, info: EngineInfo) -> EngineStats:
        reqs = self.requests
        kv = self._sample.get("kvCacheStats") or {}
        waiting = sum(1 for r in reqs.values() if r.first_token is None)
        return EngineStats(
            running=len(reqs) - waiting, waiting=waiting, kv_blocks_total=info.num_kv_blocks,
            kv_blocks_used=int(kv.get("usedNumBlocks") or 0) if reqs else 0,
            prefix_cache_hit_rate=self._cached_total / self._prompt_total if self._prompt_total else 0.0,
            step_latency_s=(self._sample.get("iterLatencyMS") or 0.0) / 1000.0,
            steps_total=int(self._sample.get("iter") or 0), prompt_tokens_total=self._prompt_total,
            generation_tokens_total=self._gen_total, prefix_cache_hit_tokens_total=self._cached_total,
            tokens_per_s=self._tokens_per_s,
            speculation=SpeculationStats(draft_tokens=self._spec[0], accepted_tokens=self._spec[1],
                                         verifications=self._spec[2]) if self._speculating else None)
