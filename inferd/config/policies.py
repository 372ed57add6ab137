"""`[policies.<name>]`: safety policies a tenant is held to (`[tenants.<t>] policy = "<name>"`).

A policy has an input pre-filter (the prompt or messages, checked before the request runs) and an
output post-filter (the generated text, checked as it streams, with a hold-back window). Each is a
list of rules: regular expressions, word lists (whole words, any case), and classifiers, the names
of Python entry points in the `inferd.safety` group (inferd.safety.classifiers documents the
interface). Every regex must compile, every word be a
non-empty word, every classifier be installed: `check-config` names any that is not.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection

from inferd.config.walk import ConfigTable

POLICY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")   # a metric label and an audit field
MAX_HOLD_BACK_CHARS = 4096


class InputRules(ConfigTable):
    """`[policies.<name>.input]`."""

    patterns: tuple[str, ...] = ()        # Python regular expressions, searched anywhere in the text
    words: tuple[str, ...] = ()           # whole words or phrases, any case
    classifiers: tuple[str, ...] = ()     # entry point names in the `inferd.safety` group


class OutputRules(ConfigTable):
    """`[policies.<name>.output]`."""

    patterns: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    # Text is held back this many characters before it is sent, so a match is caught before any of it
    # reaches the client; a match longer than this may be caught only after its start went out.
    hold_back_chars: int = 64
    classifiers: tuple[str, ...] = ()     # entry points judging the text in chunks before it is sent
    classify_every_chars: int = 256       # the chunk: text reaches the client this many characters at a time
    classifier_timeout_s: float = 5.0     # per chunk; past it the stream ends with an error (fail closed)


class PolicyConfig(ConfigTable):
    """`[policies.<name>]`."""

    input: InputRules = InputRules()
    output: OutputRules = OutputRules()


def _rule_errors(path: str, patterns: tuple[str, ...], words: tuple[str, ...]) -> list[str]:
    errors = []
    for i, pattern in enumerate(patterns):
        try:
            re.compile(pattern)
        except re.error as exc:
            errors.append(f"{path}.patterns[{i}]: not a valid regular expression ({exc})")
    for i, word in enumerate(words):
        if not word.strip():
            errors.append(f"{path}.words[{i}]: must not be empty")
    return errors


def policy_errors(name: str, p: PolicyConfig, installed: Callable[[], Collection[str]],
                  path: str = "policies") -> list[str]:
    """Every problem with one decoded policy. `installed()` lists the `inferd.safety` entry points."""
    base = f"{path}.{name}"
    errors = []
    if not POLICY_NAME_RE.match(name):
        errors.append(f"{base}: a policy name is letters, digits, '-' and '_' (at most 64), got {name!r}")
    errors += _rule_errors(f"{base}.input", p.input.patterns, p.input.words)
    errors += _rule_errors(f"{base}.output", p.output.patterns, p.output.words)
    if p.input.classifiers or p.output.classifiers:
        known = installed()
        for where, names in (("input", p.input.classifiers), ("output", p.output.classifiers)):
            for i, c in enumerate(names):
                if c not in known:
                    errors.append(f"{base}.{where}.classifiers[{i}]: no entry point {c!r} in the 'inferd.safety' "
                                  f"group (installed: {', '.join(sorted(known)) or 'none'})")
    if not 1 <= p.output.classify_every_chars <= 65536:
        errors.append(f"{base}.output.classify_every_chars: must be between 1 and 65536, "
                      f"got {p.output.classify_every_chars}")
    if not 0 < p.output.classifier_timeout_s <= 600:
        errors.append(f"{base}.output.classifier_timeout_s: must be in (0, 600] seconds, "
                      f"got {p.output.classifier_timeout_s}")
    for i, word in enumerate(p.output.words):
        if len(word.strip()) > p.output.hold_back_chars:
            errors.append(f"{base}.output.words[{i}]: {len(word.strip())} characters, longer than hold_back_chars "
                          f"({p.output.hold_back_chars}): its start could reach the client before it is caught")
    for where, patterns in (("input", p.input.patterns), ("output", p.output.patterns)):
        for i, pattern in enumerate(patterns):
            try:
                empty = re.search(pattern, "") is not None
            except re.error:
                continue                    # reported above
            if empty:
                errors.append(f"{base}.{where}.patterns[{i}]: matches the empty string, so it would match "
                              "every text")
    if not 0 <= p.output.hold_back_chars <= MAX_HOLD_BACK_CHARS:
        errors.append(f"{base}.output.hold_back_chars: must be between 0 and {MAX_HOLD_BACK_CHARS}, "
                      f"got {p.output.hold_back_chars}")
    return errors


def installed_classifiers() -> set[str]:
    from importlib.metadata import entry_points
    return {ep.name for ep in entry_points(group="inferd.safety")}
