"""`[slos.<name>]`: service level objectives, the yardstick for alerts, dashboards and capacity.

One table is one SLO: which requests it judges (`model`, an alias or served model, and optionally
one `priority` class), what makes one of them good (`sli` and, for latency, `threshold_ms`), the
fraction that must be good (`objective`) and the period that fraction is kept over (`window_days`).
A "p99 TTFT of 2 s" target is `sli = "ttft"`, `threshold_ms = 2000`, `objective = 0.99`.

The SLIs (inferd.slo.events says exactly which requests count):
- `ttft`: requests that got a first token; good when it reached the client within threshold_ms.
- `itl`: requests with two or more tokens; good when their mean inter-token gap is within threshold_ms.
- `latency`: answered requests (200); good when the whole answer took at most threshold_ms, arrival to
  response. For unary models (embeddings), whose batcher also takes its latency target from it.
- `availability`: answered requests, except client errors and intentional refusals (4xx: quota,
  bad input, auth) and clients that left; good when the answer was not a server error (5xx).
- `stream_completion`: streams whose headers went out; good when they ended with `[DONE]`.
"""
from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import Literal

from inferd.config.tenants import PriorityClass
from inferd.config.walk import ConfigTable

SliKind = Literal["ttft", "itl", "latency", "availability", "stream_completion"]
LATENCY_SLIS = ("ttft", "itl", "latency")
# SLO names become Prometheus label values and rule names: keep them plain.
SLO_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# The longest burn-rate window the rules use (inferd.slo.burn): an SLO window shorter than it makes
# the slow-burn alerts meaningless.
MIN_WINDOW_DAYS = 3.0


class SloConfig(ConfigTable):
    """`[slos.<name>]`."""

    model: str                                  # a served model or an alias; requests asking for it
    sli: SliKind
    objective: float                            # fraction of good events, e.g. 0.999
    threshold_ms: float | None = None           # ttft, itl and latency only: at most this is good
    priority: PriorityClass | None = None       # only requests of this class (default: every class)
    window_days: float = 30.0                   # the error budget's period
    description: str = ""

    @property
    def error_budget(self) -> float:
        """The fraction of events allowed to be bad."""
        return 1.0 - self.objective


def slo_errors(name: str, slo: SloConfig, known_models: Collection[str], path: str = "slos") -> list[str]:
    """Every problem with one decoded SLO, each as `path: problem`."""
    p = f"{path}.{name}"
    errors = []
    if not SLO_NAME_RE.match(name):
        errors.append(f"{p}: an SLO name is letters, digits, '-' and '_' (at most 64), got {name!r}")
    if slo.model not in known_models:
        errors.append(f"{p}.model: no model or alias named {slo.model!r} (known: {', '.join(sorted(known_models))})")
    if not (0.0 < slo.objective < 1.0) or math.isnan(slo.objective):
        errors.append(f"{p}.objective: must be a fraction between 0 and 1 (0.999 is 99.9%), got {slo.objective}")
    if slo.sli in LATENCY_SLIS:
        if slo.threshold_ms is None:
            errors.append(f"{p}.threshold_ms: required for sli = {slo.sli!r} (the latency a good request is within)")
        elif not (0.0 < slo.threshold_ms < math.inf):
            errors.append(f"{p}.threshold_ms: must be a positive number of milliseconds, got {slo.threshold_ms}")
    elif slo.threshold_ms is not None:
        errors.append(f"{p}.threshold_ms: only for sli = 'ttft', 'itl' or 'latency' "
                      f"({slo.sli!r} has no latency threshold)")
    if not (MIN_WINDOW_DAYS <= slo.window_days <= 366):
        errors.append(f"{p}.window_days: must be between {MIN_WINDOW_DAYS:g} (the longest burn-rate window) and "
                      f"366, got {slo.window_days}")
    return errors
