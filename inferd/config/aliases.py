"""`[aliases.<name>]` tables: decoding, checks with their config paths, and the splits they build.

Targets are "model@version" or a bare model name meaning its configured default version.
"""
from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping

import msgspec

from inferd.config.tenants import TENANT_NAME_RE
from inferd.types import ModelVersion

# Names of models and aliases: URL path and metric-label safe.
ROUTE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class RoutingConfigError(ValueError):
    """A split or alias table that cannot be routed (bad weights, name clash)."""


class Arm(msgspec.Struct, frozen=True):
    target: ModelVersion
    weight: float


class TierRule(msgspec.Struct, frozen=True):
    """A precision tier: the requests of one priority class or tenant go to these arms instead of the split's."""

    key: str                    # the config key that says so: "tiers.batch", "tenants.acme"
    arms: tuple[Arm, ...]       # one version, or a weighted split of versions of the same model


class Split(msgspec.Struct, frozen=True):
    """How a route name (alias or model name) spreads traffic over versions. `tenants` and `tiers` (a
    priority class's name) send those requests to versions of their own instead (precision tiers): a
    tenant's rule first, then its class's, then the arms."""

    arms: tuple[Arm, ...]
    shadow: ModelVersion | None = None
    shadow_fraction: float = 0.0
    tenants: tuple[tuple[str, TierRule], ...] = ()
    tiers: tuple[tuple[str, TierRule], ...] = ()

    def __post_init__(self) -> None:
        for arms in (self.arms, *(rule.arms for _, rule in (*self.tenants, *self.tiers))):
            check_arms(arms)
        if not 0.0 <= self.shadow_fraction <= 1.0:
            raise RoutingConfigError(f"shadow_fraction must be in [0, 1], got {self.shadow_fraction}")

    @classmethod
    def single(cls, target: ModelVersion) -> Split:
        return cls((Arm(target, 1.0),))

    def with_arms(self, *arms: Arm) -> Split:
        """Same shadow settings and tier rules, new arms (what a rollout step does)."""
        return Split(tuple(arms), self.shadow, self.shadow_fraction, self.tenants, self.tiers)

    def tier_rule(self, tenant: str, priority: str | None) -> TierRule | None:
        """The rule of the tenant, else of its priority class (None: the arms decide)."""
        for key, rule in self.tenants:
            if key == tenant:
                return rule
        for key, rule in self.tiers:
            if key == priority:
                return rule
        return None


def check_arms(arms: tuple[Arm, ...]) -> None:
    if not arms or any(a.weight < 0 or not math.isfinite(a.weight) for a in arms):
        raise RoutingConfigError("a split needs at least one arm and finite weights >= 0")
    if sum(a.weight for a in arms) <= 0:
        raise RoutingConfigError("a split needs a positive total weight")
    if len({a.target for a in arms}) != len(arms):
        raise RoutingConfigError("a split names the same version twice")


class AliasConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`[aliases.<name>]`. Targets are "model@version" or "model" (its default version)."""

    split: dict[str, float]
    shadow: str | None = None
    shadow_fraction: float = 0.0
    # precision tiers: a priority class ("interactive", "standard", "batch") or a tenant -> its own target,
    # or its own split {target = weight, ...}
    tiers: dict[str, str | dict[str, float]] = {}
    tenants: dict[str, str | dict[str, float]] = {}


def parse_target(text: str, defaults: Mapping[str, str]) -> ModelVersion:
    """'model@version' as is; a bare model name means its default version."""
    if "@" in text:
        return ModelVersion.parse(text)
    if text not in defaults:
        raise RoutingConfigError(f"{text!r} is not a configured model (use 'model@version')")
    return ModelVersion(text, defaults[text])


def alias_errors(name: str, cfg: AliasConfig, defaults: Mapping[str, str], path: str = "aliases",
                 configured: Mapping[str, Collection[str]] | None = None) -> list[str]:
    """`path: problem` lines for the config loader (empty when the alias is routable). `configured`: each
    model's configured version ids, where the config names them all (no "latest" default)."""
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
    errors.extend(tier_errors(p, cfg, defaults, configured or {}))
    if not errors:
        try:
            split_from_config(cfg, defaults)
        except RoutingConfigError as exc:
            errors.append(f"{p}: {exc}")
    return errors


TIER_CLASSES = ("interactive", "standard", "batch")


def tier_targets(value: str | dict[str, float]) -> dict[str, float]:
    """A tier's value: one target (all of its traffic), or targets with weights."""
    return {value: 1.0} if isinstance(value, str) else value


def tier_errors(p: str, cfg: AliasConfig, defaults: Mapping[str, str],
                configured: Mapping[str, Collection[str]]) -> list[str]:
    """A tier or tenant rule names a known class (or a valid tenant name) and versions of a model the split
    already serves, configured ones where the config lists them: tiers are precisions (or sizes) of the same
    model, priced per version."""
    errors = []
    models = set()
    for target in cfg.split:
        try:
            models.add(parse_target(target, defaults).model)
        except (RoutingConfigError, ValueError):
            pass
    for table, rules in (("tiers", cfg.tiers), ("tenants", cfg.tenants)):
        for key, value in rules.items():
            where = f"{p}.{table}.{key}"
            if table == "tiers" and key not in TIER_CLASSES:
                errors.append(f"{where}: not a priority class (expected one of {', '.join(TIER_CLASSES)})")
            if table == "tenants" and not TENANT_NAME_RE.match(key):
                errors.append(f"{where}: tenant name must match {TENANT_NAME_RE.pattern}")
            errors.extend(_tier_target_errors(where, tier_targets(value), models, defaults, configured))
    return errors


def _tier_target_errors(where: str, targets: dict[str, float], models: set[str], defaults: Mapping[str, str],
                        configured: Mapping[str, Collection[str]]) -> list[str]:
    errors, arms = [], []
    for target, weight in targets.items():
        try:
            key = parse_target(target, defaults)
        except (RoutingConfigError, ValueError) as exc:
            errors.append(f"{where}: target {target!r}: {exc}")
            continue
        if models and key.model not in models:
            errors.append(f"{where}: target {target!r} is not a version of a model this alias splits "
                          f"({', '.join(sorted(models))})")
        elif key.model in configured and key.version not in configured[key.model]:
            errors.append(f"{where}: target {target!r}: version {key.version!r} is not configured in "
                          f"[models.{key.model}] (version, versions: {', '.join(configured[key.model])})")
        arms.append(Arm(key, float(weight)))
    if not errors:
        try:
            check_arms(tuple(arms))
        except RoutingConfigError as exc:
            errors.append(f"{where}: {exc}")
    return errors


def split_from_config(cfg: AliasConfig, defaults: Mapping[str, str]) -> Split:
    arms = tuple(Arm(parse_target(t, defaults), float(w)) for t, w in cfg.split.items())
    shadow = parse_target(cfg.shadow, defaults) if cfg.shadow else None
    tenants = tuple((k, _tier_rule(f"tenants.{k}", v, defaults)) for k, v in cfg.tenants.items())
    tiers = tuple((k, _tier_rule(f"tiers.{k}", v, defaults)) for k, v in cfg.tiers.items())
    return Split(arms, shadow, cfg.shadow_fraction, tenants, tiers)


def _tier_rule(key: str, value: str | dict[str, float], defaults: Mapping[str, str]) -> TierRule:
    return TierRule(key, tuple(Arm(parse_target(t, defaults), float(w)) for t, w in tier_targets(value).items()))
