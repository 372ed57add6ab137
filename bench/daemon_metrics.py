"""The daemon's /metrics as bench/node.py reads it at both ends of its window: each engine's step seconds,
generated tokens and step-loop CPU, the stream write-delay histogram, the garbage collector's pauses, and
quantiles over a histogram."""
from __future__ import annotations

import re
import urllib.request

_SAMPLE = re.compile(r'^(inferd_engine_step_seconds_sum|inferd_engine_step_seconds_count|'
                     r'inferd_engine_generated_tokens_total|inferd_engine_step_cpu_seconds_total)'
                     r'\{[^}]*model="((?:sim|torch)\d+)"[^}]*\} ([0-9.e+]+)$',
                     re.M)
_GC = re.compile(r'^inferd_gc_pause_seconds_(bucket|sum)\{generation="(\d)"(?:,le="([^"]+)")?\} ([0-9.e+]+)$', re.M)
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


def gc_pauses(text: str) -> dict[str, dict]:
    """Per generation of the daemon's garbage collector: its pauses' cumulative buckets and their sum."""
    pauses: dict[str, dict] = {}
    for kind, generation, le, value in _GC.findall(text):
        entry = pauses.setdefault(generation, {"buckets": {}, "sum": 0.0})
        if kind == "sum":
            entry["sum"] = float(value)
        else:
            entry["buckets"][float("inf") if le == "+Inf" else float(le)] = float(value)
    return pauses


def gc_window(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    """What the collector did between two gc_pauses() readings, per generation: collections, seconds in all,
    and the bucket bound the longest pause is under (None: none)."""
    out = {}
    for generation, entry in after.items():
        old = before.get(generation, {"buckets": {}, "sum": 0.0})
        counts = {b: v - old["buckets"].get(b, 0.0) for b, v in entry["buckets"].items()}
        total = counts.get(float("inf"), 0.0)
        longest = next((b for b in sorted(counts) if counts[b] >= total), None) if total else None
        out[generation] = {"collections": int(total), "seconds": entry["sum"] - old["sum"], "longest_under_s": longest}
    return out


def scrape(port: int) -> tuple[dict[str, dict[str, float]], dict[float, float], dict[str, dict]]:
    """One read of /metrics: per engine, its step seconds (sum, count), generated tokens and step-loop CPU
    seconds; the write-delay histogram's cumulative buckets summed over every engine; the collector's pauses."""
    text = metrics_text(port)
    engines: dict[str, dict[str, float]] = {}
    for name, model, value in _SAMPLE.findall(text):
        engines.setdefault(model, {})[name] = float(value)
    return engines, delay_buckets(text), gc_pauses(text)


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
