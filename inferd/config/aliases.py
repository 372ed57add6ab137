"""`[aliases.<name>]` tables: decoding, checks with their config paths, and the splits they build.

Targets are "model@version" or a bare model name meaning its configured default version.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping

import msgspec

from inferd.types import ModelVersion

# Names of models and aliases: URL path and metric-label safe.
ROUTE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class RoutingConfigError(ValueError):
    """A split or alias table that cannot be routed (bad weights, name clash)."""


class Arm(msgspec.Struct, frozen=True):
    target: ModelVersion
    weight: float


class Split(msgspec.Struct, frozen=True):
    """How a route name (alias or model name) spreads traffic over versions."""

    arms: tuple[Arm, ...]
    shadow: ModelVersion | None = None
    shadow_fraction: float = 0.0

    def __post_init__(self) -> None:
        if not self.arms or any(a.weight < 0 or not math.isfinite(a.weight) for a in self.arms):
            raise RoutingConfigError("a split needs at least one arm and finite weights >= 0")
        if sum(a.weight for a in self.arms) <= 0:
            raise RoutingConfigError("a split needs a positive total weight")
        if len({a.target for a in self.arms}) != len(self.arms):
            raise RoutingConfigError("a split names the same version twice")
        if not 0.0 <= self.shadow_fraction <= 1.0:
            raise RoutingConfigError(f"shadow_fraction must be in [0, 1], got {self.shadow_fraction}")

    @classmethod
    def single(cls, target: ModelVersion) -> Split:
        return cls((Arm(target, 1.0),))

    def with_arms(self, *arms: Arm) -> Split:
        """Same shadow settings, new arms (what a rollout step does)."""
        return Split(tuple(arms), self.shadow, self.shadow_fraction)


class AliasConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`[aliases.<name>]`. Targets are "model@version" or "model" (its default version)."""

    split: dict[str, float]
    shadow: str | None = None
    shadow_fraction: float = 0.0


def parse_target(text: str, defaults: Mapping[str, str]) -> ModelVersion:
    """'model@version' as is; a bare model name means its default version."""
    if "@" in text:
        return ModelVersion.parse(text)
    if text not in defaults:
        raise RoutingConfigError(f"{text!r} is not a configured model (use 'model@version')")
    return ModelVersion(text, defaults[text])


def alias_errors(name: str, cfg: AliasConfig, defaults: Mapping[str, str], path: str = "aliases") -> list[str]:
    """`path: problem` lines for the config loader (empty when the alias is routable)."""
    p = f"{path}.{name}"
    errors = []
    if not ROUTE_NAME_RE.match(name):
        errors.append(f"{p}: alias name must match {ROUTE_NAME_RE.pattern}")
    if name in defaults:
        errors.append(f"{p}: alias name clashes with the model of the same name")
    for target in [*cfg.split, *([cfg.shadow] if cfg.shadow else [])]:
        try:
            key = parse_target(target, defaults)
        except (RoutingConfigError, ValueError) as exc:
            errors.append(f"{p}: target {target!r}: {exc}")
            continue
        if key.model not in defaults:
            errors.append(f"{p}: target {target!r}: no [models.{key.model}] table")
    if not errors:
        try:
            split_from_config(cfg, defaults)
        except RoutingConfigError as exc:
            errors.append(f"{p}: {exc}")
    return errors


def split_from_config(cfg: AliasConfig, defaults: Mapping[str, str]) -> Split:
    arms = tuple(Arm(parse_target(t, defaults), float(w)) for t, w in cfg.split.items())
    shadow = parse_target(cfg.shadow, defaults) if cfg.shadow else None
    return Split(arms, shadow, cfg.shadow_fraction)
