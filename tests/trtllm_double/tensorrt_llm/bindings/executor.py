"""Mirrors tensorrt_llm.bindings.executor.RequestPerfMetrics (trtllm-api.md §5).

Attribute names are the ones trtllm-serve's get_perf_metrics reads (1.3-era, UNCONFIRMED for 1.2.1);
times are `datetime.timedelta` on the C++ steady clock, so only their differences mean anything to a
process with another clock.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field


@dataclass
class TimingMetrics:
    arrival_time: datetime.timedelta = datetime.timedelta(0)
    first_scheduled_time: datetime.timedelta = datetime.timedelta(0)
    first_token_time: datetime.timedelta = datetime.timedelta(0)
    last_token_time: datetime.timedelta = datetime.timedelta(0)
    kv_cache_size: int = 0
    kv_cache_transfer_start: datetime.timedelta = datetime.timedelta(0)
    kv_cache_transfer_end: datetime.timedelta = datetime.timedelta(0)


@dataclass
class KvCacheMetrics:
    num_total_allocated_blocks: int = 0
    num_new_allocated_blocks: int = 0
    num_reused_blocks: int = 0
    num_missed_blocks: int = 0


@dataclass
class RequestPerfMetrics:
    timing_metrics: TimingMetrics = field(default_factory=TimingMetrics)
    kv_cache_metrics: KvCacheMetrics = field(default_factory=KvCacheMetrics)
    first_iter: int | None = None
    last_iter: int | None = None
    iter: int | None = None
