"""Circuit breakers (`[models.<name>.breaker]`) and overload degradation (`[degrade.<route>]`).

A breaker watches each loaded version of its model: when too many of its requests fail (engine
errors, or a first token later than `slow_ttft_s`), it opens and the model's requests go to its
`fallback` (or get a quick 503) until a cool-down has passed; then a few probe requests decide
whether it closes again (inferd.models.breaker).

Degradation keeps a route's interactive work inside its SLO under overload before anything is shed:
while the route's engine has more than `queued_over` requests waiting in admission (or its oldest
has waited `oldest_wait_over_s`, or more than `batch_fill_over` of its batch slots are taken: slots
kept free for the classes not listed), the listed classes get their `max_tokens` capped, or are sent to
another model (inferd.api.pipeline.degrade).
"""
from __future__ import annotations

import math
from collections.abc import Collection

from inferd.config.tenants import PriorityClass
from inferd.config.walk import ConfigTable


class BreakerConfig(ConfigTable):
    """`[models.<name>.breaker]`; absent = no breaker for the model."""

    error_rate: float = 0.5          # open when at least this share of the window's requests failed ...
    min_requests: int = 20           # ... and the window holds at least this many
    window_s: float = 30.0
    slow_ttft_s: float | None = None  # a first token later than this counts as a failure (a timeout)
    cooldown_s: float = 15.0         # how long it stays open before probing
    half_open_requests: int = 3      # probes let through half-open; that many successes close it
    fallback: str | None = None      # a model or model@version serving the model's requests while open


class DegradeConfig(ConfigTable):
    """`[degrade.<route>]`: <route> is an alias or a served model."""

    queued_over: int | None = None              # requests waiting in admission for the route's engine
    oldest_wait_over_s: float | None = None     # or the longest wait among them
    batch_fill_over: float | None = None        # or the share of the engine's batch slots in use
    max_tokens: dict[PriorityClass, int] = {}   # cap per class while degraded
    route: dict[PriorityClass, str] = {}        # class -> another model or alias while degraded


def breaker_errors(path: str, b: BreakerConfig, known_models: Collection[str]) -> list[str]:
    errors = []
    if not 0 < b.error_rate <= 1:
        errors.append(f"{path}.error_rate: must be in (0, 1], got {b.error_rate}")
    for key in ("min_requests", "half_open_requests"):
        if getattr(b, key) < 1:
            errors.append(f"{path}.{key}: must be >= 1, got {getattr(b, key)}")
    for key in ("window_s", "cooldown_s"):
        if not 0 < getattr(b, key) < math.inf:
            errors.append(f"{path}.{key}: must be a positive number of seconds, got {getattr(b, key)}")
    if b.slow_ttft_s is not None and not 0 < b.slow_ttft_s < math.inf:
        errors.append(f"{path}.slow_ttft_s: must be a positive number of seconds, got {b.slow_ttft_s}")
    if b.fallback is not None:
        model = b.fallback.partition("@")[0]
        if model not in known_models:
            errors.append(f"{path}.fallback: no model named {model!r} (a model or model@version)")
        elif path == f"models.{model}.breaker":
            errors.append(f"{path}.fallback: a model cannot fall back to itself")
    return errors


def degrade_errors(name: str, d: DegradeConfig, known_routes: Collection[str], path: str = "degrade") -> list[str]:
    p = f"{path}.{name}"
    errors = []
    if name not in known_routes:
        errors.append(f"{p}: no model or alias named {name!r}")
    if d.queued_over is None and d.oldest_wait_over_s is None and d.batch_fill_over is None:
        errors.append(f"{p}: set queued_over, oldest_wait_over_s or batch_fill_over (when the route counts as "
                      "overloaded)")
    if d.batch_fill_over is not None and not 0 <= d.batch_fill_over < 1:
        errors.append(f"{p}.batch_fill_over: must be a fraction in [0, 1), got {d.batch_fill_over}")
    if d.queued_over is not None and d.queued_over < 0:
        errors.append(f"{p}.queued_over: must be >= 0, got {d.queued_over}")
    if d.oldest_wait_over_s is not None and not 0 <= d.oldest_wait_over_s < math.inf:
        errors.append(f"{p}.oldest_wait_over_s: must be >= 0 seconds, got {d.oldest_wait_over_s}")
    if not d.max_tokens and not d.route:
        errors.append(f"{p}: set max_tokens or route (what degrading does)")
    for cls, cap in d.max_tokens.items():
        if cap < 1:
            errors.append(f"{p}.max_tokens.{cls.value}: must be >= 1, got {cap}")
    for cls, target in d.route.items():
        if target not in known_routes:
            errors.append(f"{p}.route.{cls.value}: no model or alias named {target!r}")
        elif target == name:
            errors.append(f"{p}.route.{cls.value}: routes the class to the route itself")
    return errors
