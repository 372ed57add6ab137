"""Rollout and price configuration: `[rollouts.<route>]` and `[prices.*]` tables and their checks.

Plain structs decoded strictly from TOML; `rollout_errors` reports every problem with its path so
`check-config` and a reload can name them all at once.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from inferd.config.aliases import parse_target
from inferd.config.walk import ConfigTable
from inferd.types import ModelVersion


class RolloutThresholds(ConfigTable):
    """`[rollouts.<name>.thresholds]`: how much worse than stable the candidate may be."""

    max_error_rate_increase: float = 0.01    # absolute: candidate <= stable + 1 percentage point
    max_ttft_p95_ratio: float = 1.2
    max_itl_p95_ratio: float = 1.2
    max_cost_ratio: float = 1.1               # cost per 1k tokens
    latency_slack_s: float = 0.0              # added to the latency limits, against noise at tiny p95s
    min_samples: int = 200                    # requests per version per step before judging


class RolloutConfig(ConfigTable):
    """`[rollouts.<route>]`: <route> is an alias (or a model name). Targets as in AliasConfig."""

    stable: str
    candidate: str
    steps: tuple[float, ...] = (0.01, 0.05, 0.25, 1.0)
    min_dwell_s: float = 600.0
    start: Literal["manual", "on_load"] = "manual"
    window_size: int = 1024                   # latency samples kept per version per step
    thresholds: RolloutThresholds = RolloutThresholds()


class PriceConfig(ConfigTable):
    """`[prices."<model>@<version>"]` or `[prices.<model>]`: currency per 1k tokens."""

    prompt_per_1k: float = 0.0
    completion_per_1k: float = 0.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """What that many tokens cost at this price (the ledger's cost; a rollout's cost per 1k)."""
        return (prompt_tokens * self.prompt_per_1k + completion_tokens * self.completion_per_1k) / 1000


def price_for(prices: Mapping[str, PriceConfig], key: ModelVersion) -> PriceConfig | None:
    return prices.get(str(key)) or prices.get(key.model)


def rollout_errors(name: str, cfg: RolloutConfig, defaults: Mapping[str, str], aliases: Sequence[str],
                   path: str = "rollouts") -> list[str]:
    p = f"{path}.{name}"
    errors = []
    if name not in aliases and name not in defaults:
        errors.append(f"{p}: no alias or model named {name!r} to roll out")
    for field in ("stable", "candidate"):
        try:
            key = parse_target(getattr(cfg, field), defaults)
        except ValueError as exc:
            errors.append(f"{p}.{field}: {exc}")
            continue
        if key.model not in defaults:
            errors.append(f"{p}.{field}: no [models.{key.model}] table")
    if cfg.stable == cfg.candidate:
        errors.append(f"{p}: stable and candidate are the same version")
    s = cfg.steps
    if not s or any(not 0 < w <= 1 for w in s) or any(a >= b for a, b in zip(s, s[1:])):
        errors.append(f"{p}.steps: must be increasing weights in (0, 1], got {list(s)}")
    elif s[0] >= 1:
        errors.append(f"{p}.steps: the first step must be below 1.0 so stable gives a baseline")
    if cfg.min_dwell_s < 0:
        errors.append(f"{p}.min_dwell_s: must be >= 0, got {cfg.min_dwell_s}")
    if cfg.window_size < 20:
        errors.append(f"{p}.window_size: must be >= 20 for a p95, got {cfg.window_size}")
    t = cfg.thresholds
    for field in ("max_error_rate_increase", "latency_slack_s"):
        if getattr(t, field) < 0:
            errors.append(f"{p}.thresholds.{field}: must be >= 0, got {getattr(t, field)}")
    for field in ("max_ttft_p95_ratio", "max_itl_p95_ratio", "max_cost_ratio"):
        if getattr(t, field) < 1:
            errors.append(f"{p}.thresholds.{field}: must be >= 1, got {getattr(t, field)}")
    if t.min_samples < 1:
        errors.append(f"{p}.thresholds.min_samples: must be >= 1, got {t.min_samples}")
    return errors
