"""The daemon's /metrics as bench/node.py reads it at both ends of its window: each engine's step seconds
and generated tokens, the stream write-delay histogram, and quantiles over either."""
from __future__ import annotations

import re
import urllib.request

_SAMPLE = re.compile(r'^(inferd_engine_step_seconds_sum|inferd_engine_step_seconds_count|'
                     r'inferd_engine_generated_tokens_total)\{[^}]*model="((?:sim|torch)\d+)"[^}]*\} ([0-9.e+]+)$',
                     re.M)
_DELAY = re.compile(r'^inferd_stream_write_delay_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} ([0-9.e+]+)$', re.M)


def metrics_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def delay_buckets(text: str) -> dict[float, float]:
    """The write-delay histogram's cumulative buckets, summed over every engine."""
    delay: dict[float, float] = {}
    for le, value in _DELAY.findall(text):
        bound = float("inf") if le == "+Inf" else float(le)
        delay[bound] = delay.get(bound, 0.0) + float(value)
    return delay


def scrape(port: int) -> tuple[dict[str, dict[str, float]], dict[float, float]]:
    """Per engine: its step seconds (sum, count) and generated tokens; and the write-delay histogram's
    cumulative buckets summed over every engine."""
    text = metrics_text(port)
    engines: dict[str, dict[str, float]] = {}
    for name, model, value in _SAMPLE.findall(text):
        engines.setdefault(model, {})[name] = float(value)
    return engines, delay_buckets(text)


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile: linear within the bucket holding the q-th observation."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(buckets[bound] - below, 1e-12)
        lower, below = bound, buckets[bound]
    return lower


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")
