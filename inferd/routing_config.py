"""`[aliases.<name>]` tables: decoding, checks with their config paths, and the splits they build.

Targets are "model@version" or a bare model name meaning its configured default version.
"""
from __future__ import annotations

from collections.abc import Mapping

import msgspec

from inferd.routing import ROUTE_NAME_RE, Arm, ModelVersion, RoutingConfigError, Split


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
