"""A policy's rules compiled into one search: regular expressions and word lists, named, never echoed.

`RuleSet.search(text)` returns the first match's start and a label for it (`pattern 2`, `word list`):
what counts, audits and logs record. The matched text itself is never returned to a caller that
could send or store it.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec


class RuleMatch(msgspec.Struct, frozen=True):
    start: int            # where the match begins in the searched text
    rule: str             # which rule matched: "pattern <i>" or "word list"


class RuleSet:
    """Each pattern compiled on its own (a pattern may carry its own global flags, such as `(?i)`) and the
    words as one alternation; a search returns the earliest match of any of them."""

    __slots__ = ("_rules",)

    def __init__(self, patterns: Sequence[str] = (), words: Sequence[str] = ()) -> None:
        self._rules: list[tuple[str, re.Pattern]] = [(f"pattern {i}", re.compile(p)) for i, p in enumerate(patterns)]
        if words:
            alternation = "|".join(re.escape(w.strip()) for w in sorted(words, key=len, reverse=True))
            self._rules.append(("word list", re.compile(rf"\b(?:{alternation})\b", re.IGNORECASE)))

    def __bool__(self) -> bool:
        return bool(self._rules)

    def search(self, text: str) -> RuleMatch | None:
        best: RuleMatch | None = None
        for label, regex in self._rules:
            m = regex.search(text)
            if m is not None and (best is None or m.start() < best.start):
                best = RuleMatch(m.start(), label)
        return best
