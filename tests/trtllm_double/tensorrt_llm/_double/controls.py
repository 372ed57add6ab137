"""Knobs tests use to steer the double (fault injection, model behaviour, timing)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Controls:
    step_time_s: float = 0.0            # simulated GPU time per iteration
    stats_poll_s: float = 0.2           # how often the worker forwards iteration stats (real: ~0.2 s)
    eos_after: int | None = None        # the fake model emits EOS as its N-th generated token
    fail_next_requests: int = 0         # the next N enqueued requests fail with an error response
    crash_with: BaseException | None = None   # the executor thread dies with this at its next iteration
    drop_cancel_replies: bool = False   # a cancelled request is dropped without its final 'cancelled' reply
    perf_metrics: bool = True           # honour SamplingParams.return_perf_metrics (False: a build without them)
    fake_gpu_kv_tokens: int = 1 << 16   # KV tokens a fraction of 1.0 of "GPU memory" would hold
    calls: list = field(default_factory=list)  # (method name, kwargs) of every public LLM call
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        self.step_time_s = 0.0
        self.stats_poll_s = 0.2
        self.eos_after = None
        self.fail_next_requests = 0
        self.crash_with = None
        self.drop_cancel_replies = False
        self.perf_metrics = True
        self.fake_gpu_kv_tokens = 1 << 16
        self.calls.clear()


controls = Controls()
