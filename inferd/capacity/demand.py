"""The demand to plan for: request rate, prompt and output length distributions, SLOs, zones.

It comes from a TOML or JSON file (`--demand`), from CLI flags, or both (a flag wins over the file):

    requests_per_s = 50
    target_utilisation = 0.8     # optional, default 0.8
    zones = 3                    # optional, default 1
    [prompt]                     # tokens; mean and optional p95 (default: the mean) ...
    mean = 1500
    p95 = 4000
    [output]                     # ... or buckets = [[length, weight], ...]
    buckets = [[100, 0.5], [500, 0.4], [1000, 0.1]]
    [slo]                        # both optional
    ttft_p95_ms = 1000
    itl_p99_ms = 50

Means drive throughput (work per second is rate x mean length); p95s size what must fit a single request
(the TTFT of one prompt, the KV cache a sequence holds), so a long tail costs latency headroom, not work.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd import tomllib
from inferd.capacity.errors import DemandError

DEFAULT_TARGET_UTILISATION = 0.8
_TOP_KEYS = {"requests_per_s", "target_utilisation", "zones", "prompt", "output", "slo",
             "tiers"}     # precision tiers: inferd.capacity.tiers reads them
_LENGTH_KEYS = {"mean", "p95", "buckets"}
_SLO_KEYS = {"ttft_p95_ms", "itl_p99_ms"}


@dataclass(frozen=True)
class LengthDistribution:
    """Token lengths of prompts or outputs: the mean (for throughput) and the p95 (for what must fit)."""

    mean: float
    p95: float


@dataclass(frozen=True)
class Demand:
    requests_per_s: float
    prompt: LengthDistribution
    output: LengthDistribution
    ttft_p95_ms: float | None = None     # None: no TTFT check
    itl_p99_ms: float | None = None      # None: the decode batch is limited only by slots and KV
    target_utilisation: float = DEFAULT_TARGET_UTILISATION
    zones: int = 1

    @property
    def decode_context(self) -> float:
        """Mean context a decode step attends over: a sequence decodes from `prompt` to `prompt + output`
        tokens, so over its decode life it sees the prompt plus half its output on average."""
        return self.prompt.mean + self.output.mean / 2

    @property
    def sequence_tokens_p95(self) -> int:
        """KV one long sequence holds at its end; sizing every batch slot for it means the p95 case never
        preempts (conservative: the p95 of a sum is below the sum of the p95s)."""
        return math.ceil(self.prompt.p95 + self.output.p95)


def read_demand_file(path: str | Path) -> dict[str, Any]:
    """The raw table of a demand file: JSON if it ends in .json, TOML otherwise."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DemandError(f"cannot read demand file {path}: {exc.strerror or exc}") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DemandError(f"demand file {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: "
                          f"{exc}") from None
    if not isinstance(raw, dict):
        raise DemandError(f"demand file {path}: the top level must be a table/object")
    return raw


def with_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`raw` with dotted keys ("prompt.mean") replaced by the values that are not None (CLI flags)."""
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for dotted, value in overrides.items():
        if value is None:
            continue
        table, _, key = dotted.rpartition(".")
        if not table:
            merged[key] = value
            continue
        section = merged.get(table)
        if not isinstance(section, dict):
            section = merged[table] = {}
        if key in ("mean", "p95"):
            section.pop("buckets", None)     # a flag replaces the file's buckets, it does not mix with them
        section[key] = value
    return merged


def build_demand(raw: dict[str, Any]) -> Demand:
    """Validate a raw demand table (file and flags merged); errors name the field and the flag."""
    _no_unknown_keys(raw, _TOP_KEYS, "")
    rate = _number(raw, "requests_per_s", "--rate", required=True)
    if rate <= 0:
        raise DemandError(f"requests_per_s (--rate) must be > 0, got {rate}")
    slo = _table(raw, "slo")
    _no_unknown_keys(slo, _SLO_KEYS, "slo.")
    ttft = _number(slo, "ttft_p95_ms", "--ttft-p95-ms", prefix="slo.")
    itl = _number(slo, "itl_p99_ms", "--itl-p99-ms", prefix="slo.")
    for name, value in (("ttft_p95_ms", ttft), ("itl_p99_ms", itl)):
        if value is not None and value <= 0:
            raise DemandError(f"slo.{name} must be > 0 ms, got {value}")
    util = _number(raw, "target_utilisation", "--target-utilisation")
    util = DEFAULT_TARGET_UTILISATION if util is None else util
    if not 0 < util <= 1:
        raise DemandError(f"target_utilisation (--target-utilisation) must be in (0, 1], got {util}")
    zones = raw.get("zones", 1)
    if isinstance(zones, bool) or not isinstance(zones, int) or zones < 1:
        raise DemandError(f"zones (--zones) must be a whole number >= 1, got {zones!r}")
    return Demand(requests_per_s=float(rate), prompt=_lengths(raw, "prompt"), output=_lengths(raw, "output"),
                  ttft_p95_ms=None if ttft is None else float(ttft), itl_p99_ms=None if itl is None else float(itl),
                  target_utilisation=float(util), zones=zones)


def _lengths(raw: dict[str, Any], name: str) -> LengthDistribution:
    table = _table(raw, name)
    _no_unknown_keys(table, _LENGTH_KEYS, f"{name}.")
    if "buckets" in table:
        if "mean" in table or "p95" in table:
            raise DemandError(f"{name}: give either buckets or mean/p95, not both")
        return _from_buckets(name, table["buckets"])
    mean = _number(table, "mean", f"--{name}-mean", prefix=f"{name}.", required=True)
    p95 = _number(table, "p95", f"--{name}-p95", prefix=f"{name}.")
    p95 = mean if p95 is None else p95
    for key, value in (("mean", mean), ("p95", p95)):
        if value < 1:
            raise DemandError(f"{name}.{key} must be >= 1 token, got {value}")
    return LengthDistribution(mean=float(mean), p95=float(p95))


def _from_buckets(name: str, buckets: Any) -> LengthDistribution:
    """Weighted (length, weight) pairs: the weighted mean, and the smallest length whose cumulative
    weight reaches 95% (weights need not sum to 1)."""
    if not isinstance(buckets, list) or not buckets:
        raise DemandError(f"{name}.buckets must be a non-empty list of [length, weight] pairs")
    pairs = []
    for i, bucket in enumerate(buckets):
        ok = isinstance(bucket, (list, tuple)) and len(bucket) == 2 and all(_is_number(v) for v in bucket)
        if not ok or bucket[0] < 1 or bucket[1] < 0:
            raise DemandError(f"{name}.buckets[{i}] must be [length >= 1, weight >= 0], got {bucket!r}")
        pairs.append((float(bucket[0]), float(bucket[1])))
    total = sum(w for _, w in pairs)
    if total <= 0:
        raise DemandError(f"{name}.buckets: the weights sum to 0")
    cumulative, p95 = 0.0, max(length for length, _ in pairs)
    for length, weight in sorted(pairs):
        cumulative += weight
        if cumulative >= 0.95 * total:
            p95 = length
            break
    return LengthDistribution(mean=sum(length * w for length, w in pairs) / total, p95=p95)


def _table(raw: dict[str, Any], name: str) -> dict[str, Any]:
    table = raw.get(name, {})
    if not isinstance(table, dict):
        raise DemandError(f"{name} must be a table ([{name}] in TOML, an object in JSON)")
    return table


def _number(table: dict[str, Any], key: str, flag: str, *, prefix: str = "", required: bool = False):
    value = table.get(key)
    if value is None:
        if required:
            raise DemandError(f"{prefix}{key} is required ({flag}, or the demand file)")
        return None
    if not _is_number(value):
        raise DemandError(f"{prefix}{key} ({flag}) must be a number, got {value!r}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _no_unknown_keys(table: dict[str, Any], known: set[str], prefix: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise DemandError(f"unknown demand key(s) {', '.join(prefix + k for k in unknown)}; "
                          f"known: {', '.join(prefix + k for k in sorted(known))}")
