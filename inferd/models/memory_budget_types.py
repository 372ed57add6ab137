"""What the model lifecycle (inferd.models.memory_budget) answers with and counts: its refusals and histograms."""
from __future__ import annotations


class LifecycleError(Exception):
    """A request for a version that is not hot and cannot be served now: 503 (409 for the admin's misuse)."""

    def __init__(self, message: str, code: str, retry_after_s: float | None = None, status: int = 503) -> None:
        super().__init__(message)
        self.busy = False           # no room only because requests are in flight on what could go
        self.code = code
        self.retry_after_s = retry_after_s
        self.status = status


class Histogram:
    """Cumulative bucket counts, a sum and a count: what Prometheus reads at scrape time."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
