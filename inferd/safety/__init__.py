"""Safety policies: per-tenant input pre-filters and streaming output post-filters.

`Policies` compiles `[policies.*]` and says which one holds a tenant; `Policy.check_input` judges a
prompt; `FilteredStream` holds back and searches generated text as it streams. Matched text is never
sent, logged, counted or audited: only the policy and the rule that matched.
"""
from __future__ import annotations

from inferd.safety.classified import ClassifiedStream
from inferd.safety.classifiers import ClassifierError, ClassifierFailed, SafetyClassifier
from inferd.safety.policy import Policies, Policy, Verdict
from inferd.safety.rules import RuleMatch, RuleSet
from inferd.safety.stream import FilteredStream

__all__ = [
    "ClassifiedStream", "ClassifierError", "ClassifierFailed", "FilteredStream", "Policies", "Policy",
    "RuleMatch", "RuleSet", "SafetyClassifier", "Verdict",
]
