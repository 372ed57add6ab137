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
    """How a route name (alias or model name) spreads traffic over versions. `tenants` and `tiers` (a
    priority class's name) send those requests to a version of their own instead (precision tiers): a
    tenant's rule first, then its class's, then the arms."""

    arms: tuple[Arm, ...]
    shadow: ModelVersion | None = None
    shadow_fraction: float = 0.0
    tenants: tuple[tuple[str, ModelVersion], ...] = ()
    tiers: tuple[tuple[str, ModelVersion], ...] = ()

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
        """Same shadow settings and tier rules, new arms (what a rollout step does)."""
        return Split(tuple(arms), self.shadow, self.shadow_fraction, self.tenants, self.tiers)

    def tier_target(self, tenant: str, priority: str | None) -> ModelVersion | None:
        """The version a tenant's or its class's rule names (None: the arms decide)."""
        for key, target in self.tenants:
            if key == tenant:
                return target
        for key, target in self.tiers:
            if key == priority:
                return target
        return None


class AliasConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`[aliases.<name>]`. Targets are "model@version" or "model" (its default version)."""

    split: dict[str, float]
    shadow: str | None = None
    shadow_fraction: float = 0.0
    # precision tiers: a priority class ("interactive", "standard", "batch") or a tenant -> its own target
    tiers: dict[str, str] = {}
    tenants: dict[str, str] = {}


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
    errors.extend(tier_errors(p, cfg, defaults))
    if not errors:
        try:
            split_from_config(cfg, defaults)
        except RoutingConfigError as exc:
            errors.append(f"{p}: {exc}")
    return errors


TIER_CLASSES = ("interactive", "standard", "batch")


def tier_errors(p: str, cfg: AliasConfig, defaults: Mapping[str, str]) -> list[str]:
    """A tier or tenant rule names a known class and a version of a model the split already serves: tiers
    are precisions (or sizes) of the same model, priced per version."""
    errors = []
    models = set()
    for target in cfg.split:
        try:
            models.add(parse_target(target, defaults).model)
        except (RoutingConfigError, ValueError):
            pass
    for table, rules in (("tiers", cfg.tiers), ("tenants", cfg.tenants)):
        for key, target in rules.items():
            where = f"{p}.{table}.{key}"
            if table == "tiers" and key not in TIER_CLASSES:
                errors.append(f"{where}: not a priority class (expected one of {', '.join(TIER_CLASSES)})")
            try:
                model = parse_target(target, defaults).model
            except (RoutingConfigError, ValueError) as exc:
                errors.append(f"{where}: target {target!r}: {exc}")
                continue
            if models and model not in models:
                errors.append(f"{where}: target {target!r} is not a version of a model this alias splits "
                              f"({', '.join(sorted(models))})")
    return errors


def split_from_config(cfg: AliasConfig, defaults: Mapping[str, str]) -> Split:
    arms = tuple(Arm(parse_target(t, defaults), float(w)) for t, w in cfg.split.items())
    shadow = parse_target(cfg.shadow, defaults) if cfg.shadow else None
    tenants = tuple((k, parse_target(t, defaults)) for k, t in cfg.tenants.items())
    tiers = tuple((k, parse_target(t, defaults)) for k, t in cfg.tiers.items())
    return Split(arms, shadow, cfg.shadow_fraction, tenants, tiers)
