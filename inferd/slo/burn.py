"""Error-budget burn rates in process: good/bad counts in time buckets, summed when scraped.

The hot path adds one event to three bucket rings (a few integer adds); nothing keeps a list per
request. Burn rate over a window = (bad / all events in the window) / error budget: 1 spends the
budget exactly over the SLO window, 14.4 spends 2% of a 30-day budget in one hour.

The windows are the Google SRE workbook's multi-window pairs (5m/1h, 30m/6h, 2h/1d, 6h/3d). Each
is read from the finest ring that covers it: 10 s buckets for up to 2 h, 5 min buckets for up to
3 d, 1 h buckets for the SLO window's budget. A window covers at most what this process has seen:
after a restart the long windows fill up again (Prometheus, summing inferd_slo_events_total over
the fleet, has the durable view; inferd.slo.rules writes its rules).
"""
from __future__ import annotations

import math

# (label, seconds): every window a burn-rate alert of inferd.slo.rules reads, short ones first.
WINDOWS: tuple[tuple[str, int], ...] = (
    ("5m", 300), ("30m", 1800), ("1h", 3600), ("2h", 7200), ("6h", 21600), ("1d", 86400), ("3d", 259200))


class BucketRing:
    """Good and bad counts per fixed-width time bucket, the newest `count` buckets kept."""

    __slots__ = ("width", "count", "good", "bad", "_head")

    def __init__(self, width_s: float, count: int) -> None:
        if width_s <= 0 or count < 1:
            raise ValueError(f"a bucket ring needs a positive width and count, got {width_s}, {count}")
        self.width = width_s
        self.count = count
        self.good = [0] * count
        self.bad = [0] * count
        self._head = -1          # the absolute index (time // width) of the newest bucket; -1: none yet

    @property
    def span_s(self) -> float:
        return self.width * self.count

    def _advance(self, now: float) -> int:
        """Move to the bucket of `now`, zeroing the buckets skipped over; returns its slot."""
        index = int(now // self.width)
        head = self._head
        if index > head:
            if head < 0 or index - head >= self.count:
                self.good = [0] * self.count
                self.bad = [0] * self.count
            else:
                good, bad, count = self.good, self.bad, self.count
                for i in range(head + 1, index + 1):
                    good[i % count] = 0
                    bad[i % count] = 0
            self._head = index
        return self._head % self.count

    def add(self, now: float, good: bool) -> None:
        slot = self._advance(now)
        if good:
            self.good[slot] += 1
        else:
            self.bad[slot] += 1

    def totals(self, now: float, span_s: float) -> tuple[int, int]:
        """(good, bad) over the newest buckets covering `span_s` (the current one included)."""
        slot = self._advance(now)
        k = min(self.count, max(1, math.ceil(span_s / self.width)))
        start = slot - k + 1
        if start >= 0:
            return sum(self.good[start:slot + 1]), sum(self.bad[start:slot + 1])
        return (sum(self.good[start:]) + sum(self.good[:slot + 1]),
                sum(self.bad[start:]) + sum(self.bad[:slot + 1]))


class BurnCounter:
    """One SLO's events: cumulative totals, burn rates over WINDOWS, budget left over its window."""

    __slots__ = ("error_budget", "window_s", "good_total", "bad_total", "_rings", "_budget_ring")

    def __init__(self, error_budget: float, window_days: float) -> None:
        self.error_budget = error_budget
        self.window_s = window_days * 86400.0
        self.good_total = 0
        self.bad_total = 0
        self._rings = (BucketRing(10.0, 720), BucketRing(300.0, 864))     # 2 h and 3 d
        self._budget_ring = BucketRing(3600.0, math.ceil(window_days * 24))

    def add(self, now: float, good: bool) -> None:
        if good:
            self.good_total += 1
        else:
            self.bad_total += 1
        for ring in self._rings:
            ring.add(now, good)
        self._budget_ring.add(now, good)

    def _totals(self, now: float, span_s: float) -> tuple[int, int]:
        for ring in self._rings:
            if span_s <= ring.span_s:
                return ring.totals(now, span_s)
        return self._budget_ring.totals(now, span_s)

    def burn_rate(self, now: float, span_s: float) -> float:
        """Bad fraction over the window divided by the error budget; 0 when the window saw no events."""
        good, bad = self._totals(now, span_s)
        if not good + bad:
            return 0.0
        return bad / (good + bad) / self.error_budget

    def burn_rates(self, now: float) -> dict[str, float]:
        return {label: self.burn_rate(now, seconds) for label, seconds in WINDOWS}

    def budget_remaining(self, now: float) -> float:
        """1 - the share of the window's error budget spent (negative once overspent); 1 with no events."""
        good, bad = self._budget_ring.totals(now, self.window_s)
        if not good + bad:
            return 1.0
        return 1.0 - bad / ((good + bad) * self.error_budget)
