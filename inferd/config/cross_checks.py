"""Checks of the tables other modules declare, against the rest of the config file.

`[aliases.*]`, `[rollouts.*]`, `[prices.*]`, `[slos.*]`, `[degrade.*]` and breaker fallbacks must name
configured models; `[tenants.*]` may only
allow served models or aliases; auth may be off only on a loopback bind. The tables themselves
live in inferd.config.aliases, .rollouts, .slos and .tenants; inferd.config.root runs these.
"""
from __future__ import annotations

from typing import Any

import msgspec

from inferd.config.aliases import AliasConfig, alias_errors
from inferd.config.policies import PolicyConfig, installed_classifiers, policy_errors
from inferd.config.resilience import BreakerConfig, DegradeConfig, breaker_errors, degrade_errors
from inferd.config.rollouts import PriceConfig, RolloutConfig, rollout_errors
from inferd.config.slos import SloConfig, slo_errors
from inferd.config.tenants import (AdmissionConfig, AuthConfig, TenantConfig, admission_errors, auth_errors,
                                   bind_errors, check_auth_binding, tenant_errors)
from inferd.config.walk import check_table, decode_entries


def routing_errors(raw: dict[str, Any], errors: list[str]) -> None:
    """[aliases.*], [rollouts.*], [prices.*] and [slos.*], checked against the configured models.

    Targets name a model (its default version) or `model@version`; "latest" defaults are resolved
    only when the daemon loads the versions, so here a target's model must exist."""
    models = raw.get("models")
    defaults = {name: m.get("version", "latest") for name, m in models.items()
                if isinstance(m, dict)} if isinstance(models, dict) else {"small": "latest"}
    aliases = decode_entries(raw, "aliases", AliasConfig, errors)
    configured = _configured_versions(models)
    for name, alias in aliases.items():
        errors.extend(alias_errors(name, alias, defaults, configured=configured))
    for name, rollout in decode_entries(raw, "rollouts", RolloutConfig, errors).items():
        errors.extend(rollout_errors(name, rollout, defaults, list(aliases)))
    for name, price in decode_entries(raw, "prices", PriceConfig, errors).items():
        model = name.partition("@")[0]
        if model not in defaults:
            errors.append(f"prices.{name}: no [models.{model}] table (keys are \"model\" or \"model@version\")")
        for field in ("prompt_per_1k", "completion_per_1k"):
            if getattr(price, field) < 0:
                errors.append(f"prices.{name}.{field}: must be >= 0, got {getattr(price, field)}")
    routes = set(defaults) | set(aliases)
    for name, slo in decode_entries(raw, "slos", SloConfig, errors).items():
        errors.extend(slo_errors(name, slo, routes))
    for name, degrade in decode_entries(raw, "degrade", DegradeConfig, errors).items():
        errors.extend(degrade_errors(name, degrade, routes))
    for name, model in (models.items() if isinstance(models, dict) else ()):
        breaker = model.get("breaker") if isinstance(model, dict) else None
        if isinstance(breaker, dict):
            scratch: list[str] = []         # structural errors were reported with the model's table
            check_table(breaker, BreakerConfig, f"models.{name}.breaker", scratch)
            if not scratch:
                errors.extend(breaker_errors(f"models.{name}.breaker", msgspec.convert(breaker, BreakerConfig),
                                             defaults))


def _configured_versions(models: Any) -> dict[str, tuple[str, ...]]:
    """Each model's version ids, where the config names them all: a "latest" default is known only once the
    daemon resolves it."""
    out = {}
    for name, m in (models.items() if isinstance(models, dict) else ()):
        version, versions = (m.get("version", "latest"), m.get("versions", [])) if isinstance(m, dict) else (0, 0)
        if isinstance(version, str) and version != "latest" and isinstance(versions, list):
            out[name] = (version, *(v for v in versions if isinstance(v, str)))
    return out


def tenancy_errors(raw: dict[str, Any], errors: list[str], host: str | None) -> None:
    """[auth], [tenants.*] and [admission]: inferd.config.tenants' checks, plus what needs the rest of the file
    (a tenant's allowed_models must name served models or aliases; auth off only on loopback).
    `host` is the decoded server.host (None when [server] did not decode)."""
    tables = {}
    for key, cls in (("auth", AuthConfig), ("admission", AdmissionConfig)):
        scratch: list[str] = []          # structural errors were reported by the root pass
        check_table(raw.get(key, {}), cls, key, scratch)
        tables[key] = None if scratch else msgspec.convert(raw.get(key, {}), cls)
    if tables["auth"] is not None:
        errors.extend(auth_errors(tables["auth"]))
    if tables["admission"] is not None:
        errors.extend(admission_errors(tables["admission"]))
    models = raw.get("models")
    known = set(models) if isinstance(models, dict) else {"small"}
    aliases = raw.get("aliases")
    known |= set(aliases) if isinstance(aliases, dict) else set()
    policies = decode_entries(raw, "policies", PolicyConfig, errors)
    for name, policy in policies.items():
        errors.extend(policy_errors(name, policy, installed_classifiers))
    declared = raw.get("policies") if isinstance(raw.get("policies"), dict) else {}
    for name, tenant in decode_entries(raw, "tenants", TenantConfig, errors).items():
        errors.extend(tenant_errors(name, tenant))
        if tenant.policy is not None and tenant.policy not in declared:
            errors.append(f"tenants.{name}.policy: no [policies.{tenant.policy}] table "
                          f"(declared: {', '.join(sorted(declared)) or 'none'})")
        for i, model in enumerate(tenant.allowed_models):
            if model != "*" and model not in known:
                errors.append(f"tenants.{name}.allowed_models[{i}]: no model or alias named {model!r} "
                              f"(known: {', '.join(sorted(known))})")
    if tables["auth"] is not None and host is not None:
        errors.extend(auth_binding_errors(tables["auth"], host))


def auth_binding_errors(auth: AuthConfig, host: str) -> list[str]:
    return bind_errors("auth.mode", lambda: check_auth_binding(auth, host))
