"""The node's safety policies, compiled from `[policies.*]`, and which one holds a tenant.

Built once per config (a reload builds new ones); loop thread only. The input check runs regexes
and words first (cheap; in a thread for long prompts), then the classifiers under the request's
deadline, and answers with the first rule that matched.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import asyncio
import time

import msgspec

from inferd.config import PolicyConfig, TenantConfig
from inferd.safety.classifiers import ClassifierFailed, load_classifiers
from inferd.safety.rules import RuleSet


class Verdict(msgspec.Struct, frozen=True):
    policy: str
    rule: str            # "pattern 0", "word list", "classifier llama-guard: S1" (never the text)


class Policy:
    __slots__ = ("name", "input", "output", "hold_back_chars", "classifiers", "output_classifiers",
                 "classify_every_chars", "classifier_timeout_s")

    def __init__(self, name: str, config: PolicyConfig, classifiers: Mapping[str, object]) -> None:
        self.name = name
        self.input = RuleSet(config.input.patterns, config.input.words)
        self.output = RuleSet(config.output.patterns, config.output.words)
        self.hold_back_chars = config.output.hold_back_chars
        self.classifiers = {c: classifiers[c] for c in config.input.classifiers}
        self.output_classifiers = {c: classifiers[c] for c in config.output.classifiers}
        self.classify_every_chars = config.output.classify_every_chars
        self.classifier_timeout_s = config.output.classifier_timeout_s

    def match_input(self, text: str) -> Verdict | None:
        """The patterns and words (CPU only: a caller with a long text runs this in a thread)."""
        match = self.input.search(text)
        return Verdict(self.name, match.rule) if match is not None else None

    async def classify_input(self, text: str, tenant: str, timeout_s: float) -> Verdict | None:
        """The classifiers, in order, each bounded by what is left of `timeout_s`. ClassifierFailed
        when one raises or runs out of time (the request is refused: the policy fails closed)."""
        deadline = time.monotonic() + timeout_s
        for name, classifier in self.classifiers.items():
            try:
                label = await asyncio.wait_for(classifier.check(text, stage="input", tenant=tenant),
                                               max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise ClassifierFailed(name, timed_out=True) from None
            except Exception as exc:  # noqa: BLE001 - an operator's plugin; its message may quote the text
                raise ClassifierFailed(name, error_type=type(exc).__name__) from None
            if label is not None:
                return Verdict(self.name, f"classifier {name}: {str(label)[:80]}")
        return None


    def output_classify(self, tenant: str) -> Callable[[str], Awaitable[str | None]]:
        """The judge of a chunk of output (inferd.safety.classified): the first classifier's label, or None."""
        async def judge(text: str) -> str | None:
            for name, classifier in self.output_classifiers.items():
                label = await classifier.check(text, stage="output", tenant=tenant)
                if label is not None:
                    return f"classifier {name}: {str(label)[:80]}"
            return None
        return judge


class Policies:
    def __init__(self, policies: Mapping[str, PolicyConfig], tenant_config: Callable[[str], TenantConfig]) -> None:
        """`tenant_config(tenant)`: the tenant's config now (it changes with reloads of the tenants).
        Raises ClassifierError when a named classifier cannot be loaded."""
        names = [c for p in policies.values() for c in (*p.input.classifiers, *p.output.classifiers)]
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
