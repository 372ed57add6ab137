"""The node's safety policies, compiled from `[policies.*]`, and which one holds a tenant.

Built once per config (a reload builds new ones); loop thread only. The input check runs regexes
and words first (cheap), then the classifiers, and answers with the first rule that matched.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from inferd.config import PolicyConfig, TenantConfig
from inferd.safety.classifiers import load_classifiers
from inferd.safety.rules import RuleSet


class Verdict(msgspec.Struct, frozen=True):
    policy: str
    rule: str            # "pattern 0", "word list", "classifier llama-guard: S1" (never the text)


class Policy:
    __slots__ = ("name", "input", "output", "hold_back_chars", "classifiers")

    def __init__(self, name: str, config: PolicyConfig, classifiers: Mapping[str, object]) -> None:
        self.name = name
        self.input = RuleSet(config.input.patterns, config.input.words)
        self.output = RuleSet(config.output.patterns, config.output.words)
        self.hold_back_chars = config.output.hold_back_chars
        self.classifiers = {c: classifiers[c] for c in config.input.classifiers}

    async def check_input(self, text: str, tenant: str) -> Verdict | None:
        match = self.input.search(text)
        if match is not None:
            return Verdict(self.name, match.rule)
        for name, classifier in self.classifiers.items():
            label = await classifier.check(text, stage="input", tenant=tenant)
            if label is not None:
                return Verdict(self.name, f"classifier {name}: {str(label)[:80]}")
        return None


class Policies:
    def __init__(self, policies: Mapping[str, PolicyConfig], tenant_config: Callable[[str], TenantConfig]) -> None:
        """`tenant_config(tenant)`: the tenant's config now (it changes with reloads of the tenants).
        Raises ClassifierError when a named classifier cannot be loaded."""
        names = [c for p in policies.values() for c in p.input.classifiers]
        classifiers = load_classifiers(names) if names else {}
        self._policies = {name: Policy(name, cfg, classifiers) for name, cfg in policies.items()}
        self._tenant_config = tenant_config

    def __bool__(self) -> bool:
        return bool(self._policies)

    def for_tenant(self, tenant: str) -> Policy | None:
        if not self._policies:
            return None
        name = self._tenant_config(tenant).policy
        return self._policies.get(name) if name is not None else None
