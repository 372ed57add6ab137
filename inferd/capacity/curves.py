"""Throughput curves: what one replica of a profile can do, from the sim roofline or a measured file.

A measured-curves file (`--curves FILE`, JSON) looks like

    {"profiles": {
        "llama3-8b-h100": {
            "gpus_per_replica": 1,                 # GPUs one replica occupies (its tensor-parallel degree)
            "prefill_tokens_per_s": 21000,         # prompt tokens/s with the token budget full
            "decode": [{"batch": 1, "step_s": 0.0061}, {"batch": 64, "step_s": 0.0079},
                       {"batch": 256, "step_s": 0.0150}],   # decode step time by batch, ascending batch
            "max_batch": 200,                      # optional: slots/KV limit (default: the last measured batch)
            "description": "bench run 2026-05-01"  # optional
        }}}

Step times between measured batches are interpolated linearly; nothing is extrapolated past the last
measured batch. Measured curves hold at the context they were measured at: measure at the demand's.
"""
from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.capacity.demand import Demand
from inferd.capacity.errors import CurvesError, SloUnreachable

_PROFILE_KEYS = {"gpus_per_replica", "prefill_tokens_per_s", "decode", "max_batch", "description"}


@dataclass(frozen=True)
class ThroughputCurve:
    """One replica of one profile, at one demand's lengths."""

    name: str
    source: str                               # where the figures come from, printed with the plan
    gpus_per_replica: int
    prefill_tokens_per_s: float               # prompt tokens/s with the token budget full, at the mean prompt
    prefill_p95_s: float                      # one p95 prompt prefilled alone: the floor under its TTFT
    decode: tuple[tuple[int, float], ...]     # (batch, decode step seconds), batch strictly ascending
    max_batch: int                            # the largest batch the replica holds (slots, KV)
    max_batch_reason: str                     # which limit set max_batch

    def step_s(self, batch: int) -> float:
        """Decode step time at `batch`, linear between measured points (within the measured range)."""
        batches = [b for b, _ in self.decode]
        i = bisect.bisect_left(batches, batch)
        if i < len(batches) and batches[i] == batch:
            return self.decode[i][1]
        if i == 0 or i == len(batches):
            raise ValueError(f"batch {batch} is outside the curve's range {batches[0]}..{batches[-1]}")
        (b0, s0), (b1, s1) = self.decode[i - 1], self.decode[i]
        return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)

    def decode_batch_within(self, itl_s: float | None) -> int:
        """The largest batch whose step fits the ITL target (and the replica's max_batch).

        Raises SloUnreachable when even the smallest batch is too slow: more replicas would not help."""
        smallest, top = self.decode[0][0], min(self.max_batch, self.decode[-1][0])
        if itl_s is None:
            return top
        fitting = [b for b in range(smallest, top + 1) if self.step_s(b) <= itl_s]
        if not fitting:
            raise SloUnreachable(self.name, f"no batch meets itl_p99_ms={itl_s * 1e3:g}: the profile's "
                                            f"batch-{smallest} step is {self.step_s(smallest) * 1e3:.1f} ms")
        return fitting[-1]


def load_curves(path: str | Path, demand: Demand) -> list[ThroughputCurve]:
    """Every profile of a measured-curves file, validated; errors name the field as a path."""
    path = Path(path)
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CurvesError(f"cannot read curves file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise CurvesError(f"curves file {path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or set(raw) != {"profiles"}:
        raise CurvesError(f"{path}: the top level must be an object with exactly one key, 'profiles'")
    profiles = raw["profiles"]
    if not isinstance(profiles, dict) or not profiles:
        raise CurvesError(f"{path}: profiles must be a non-empty object of name -> curve")
    return [_curve(f"{path}: profiles.{name}", name, spec, demand, path) for name, spec in profiles.items()]


def _curve(where: str, name: str, spec: Any, demand: Demand, path: Path) -> ThroughputCurve:
    if not isinstance(spec, dict):
        raise CurvesError(f"{where} must be an object")
    unknown = sorted(set(spec) - _PROFILE_KEYS)
    if unknown:
        raise CurvesError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_PROFILE_KEYS))}")
    gpus = _positive(spec, "gpus_per_replica", where, integer=True)
    prefill = _positive(spec, "prefill_tokens_per_s", where)
    points = spec.get("decode")
    if not isinstance(points, list) or not points:
        raise CurvesError(f"{where}.decode must be a non-empty list of {{\"batch\": n, \"step_s\": s}}")
    decode: list[tuple[int, float]] = []
    for i, point in enumerate(points):
        at = f"{where}.decode[{i}]"
        if not isinstance(point, dict) or set(point) != {"batch", "step_s"}:
            raise CurvesError(f"{at} must be an object with exactly batch and step_s")
        batch = _positive(point, "batch", at, integer=True)
        if decode and batch <= decode[-1][0]:
            raise CurvesError(f"{at}.batch must be above the previous point's ({decode[-1][0]}), got {batch}")
        decode.append((batch, float(_positive(point, "step_s", at))))
    max_batch = decode[-1][0] if spec.get("max_batch") is None else _positive(spec, "max_batch", where, integer=True)
    if max_batch < decode[0][0]:
        raise CurvesError(f"{where}.max_batch ({max_batch}) is below the smallest measured batch ({decode[0][0]})")
    if "description" in spec and not isinstance(spec["description"], str):
        raise CurvesError(f"{where}.description must be a string")
    return ThroughputCurve(
        name=name, source=f"measured ({path.name})", gpus_per_replica=gpus, prefill_tokens_per_s=float(prefill),
        # A lone long prompt runs at about the full-budget rate (its chunks fill the budget themselves).
        prefill_p95_s=demand.prompt.p95 / prefill, decode=tuple(decode),
        max_batch=min(max_batch, decode[-1][0]),
        max_batch_reason="max_batch" if max_batch <= decode[-1][0] else "last measured")


def _positive(table: dict[str, Any], key: str, where: str, *, integer: bool = False):
    value = table.get(key)
    kind = "a whole number >= 1" if integer else "a number > 0"
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or not math.isfinite(value) or value <= 0 or (integer and value < 1):
        raise CurvesError(f"{where}.{key} must be {kind}, got {value!r}")
    return value
