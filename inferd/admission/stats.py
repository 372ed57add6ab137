"""Per-tenant tallies of one admission queue, read at scrape time (AdmissionQueue.snapshot).

Keyed by the tenant's bounded metric label (configured tenants, `local`, else `other`), so the
series stay bounded whatever tenant names requests carry.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from inferd.admission.backlog import Backlog
from inferd.config import CLASSES_BY_RANK


class _TenantStats:
    __slots__ = ("admitted", "rejections", "prompt_tokens", "output_tokens", "wait_sum", "wait_n",
                 "ttft_sum", "ttft_n")

    def __init__(self) -> None:
        self.admitted = 0
        self.rejections: dict[str, int] = {}
        self.prompt_tokens = self.output_tokens = 0
        self.wait_sum = self.ttft_sum = 0.0
        self.wait_n = self.ttft_n = 0


class AdmissionStats:
    """Loop-thread only."""

    def __init__(self) -> None:
        self._by_label: dict[str, _TenantStats] = {}

    def _get(self, label: str) -> _TenantStats:
        st = self._by_label.get(label)
        if st is None:
            st = self._by_label[label] = _TenantStats()
        return st

    def rejected(self, label: str, reason: str) -> None:
        st = self._get(label)
        st.rejections[reason] = st.rejections.get(reason, 0) + 1

    def admitted(self, label: str, prompt_tokens: int, queue_wait_s: float) -> None:
        st = self._get(label)
        st.admitted += 1
        st.prompt_tokens += prompt_tokens
        st.wait_sum += queue_wait_s
        st.wait_n += 1

    def first_token(self, label: str, ttft_s: float) -> None:
        st = self._get(label)
        st.ttft_sum += ttft_s
        st.ttft_n += 1

    def output(self, label: str, tokens: int) -> None:
        self._get(label).output_tokens += tokens

    def snapshot(self, backlog: Backlog, counters: Mapping[str, float], label: Callable[[str], str],
                 running: int, rate: float | None, now: float) -> dict:
        """The queue's values for the Prometheus series (see docs/tenants.md): rows keyed by tenant label.
        A class's `oldest_wait_s` is how long its longest-waiting request has been queued (an autoscaling
        signal: docs/slos.md)."""
        tenants = {lb: self._row(st) for lb, st in self._by_label.items()}
        for name, counter in counters.items():
            row = tenants.setdefault(label(name), self._row(None))
            row["vtc"] = max(row["vtc"], counter)
        classes = {c.value: {"queued": 0, "queued_tokens": 0, "oldest_wait_s": 0.0} for c in CLASSES_BY_RANK}
        for name, q in backlog.fifos.items():
            for t in q:
                row = tenants.setdefault(label(name), self._row(None))
                row["queued"] += 1
                row["queued_tokens"] += t.tokens
                cls = classes[t.cls.value]
                cls["queued"] += 1
                cls["queued_tokens"] += t.tokens
                cls["oldest_wait_s"] = max(cls["oldest_wait_s"], now - t.arrived)
        return {"tenants": tenants, "classes": classes, "running": running, "queued": backlog.requests,
                "queued_tokens": backlog.total_tokens, "throughput_cost_per_s": rate}

    @staticmethod
    def _row(st: _TenantStats | None) -> dict:
        st = st or _TenantStats()
        return {"admitted": st.admitted, "rejections": dict(st.rejections), "prompt_tokens": st.prompt_tokens,
                "output_tokens": st.output_tokens, "queue_wait_sum_s": st.wait_sum, "queue_wait_count": st.wait_n,
                "ttft_sum_s": st.ttft_sum, "ttft_count": st.ttft_n, "queued": 0, "queued_tokens": 0, "vtc": 0.0}
