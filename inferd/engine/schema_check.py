"""JSON Schema keywords that xgrammar compiles but does not enforce, found before compiling.

xgrammar (0.2.x) ignores some keywords: a grammar built from such a schema accepts output the schema
rejects, so "the output always validates" would be false, silently. Each was measured through the sim (its
tokens obey the mask) and checked with `jsonschema`: `allOf` with two schemas or more (ignored whole: any
JSON value), `not`, `if`/`then`/`else`, `uniqueItems`, `contains`/`minContains`/`maxContains`,
`dependentRequired`/`dependentSchemas`/`dependencies`; `maxLength: -1` reads as "no bound"; and a
`required` name that `properties` does not define can never be written (the grammar is strict: no property
the schema does not name). Those are refused here, with where they are, as vLLM's xgrammar backend refuses
the features it lacks (vllm/v1/structured_output/backend_xgrammar.py has_xgrammar_unsupported_json_features).
`oneOf` is kept: xgrammar treats it as `anyOf`, exact for the disjoint unions Pydantic writes.

A schema nested deeper than MAX_DEPTH subschemas is refused too: xgrammar's compile time grows about with
the cube of the depth (objects inside objects: 128 levels 0.4 s, 300 levels 4 s, 450 levels 15 s, on one
core), and a compile cannot be interrupted. OpenAI's strict mode allows 10 levels. So is an object with
more than MAX_OPTIONAL optional properties (in `properties`, not in `required`): xgrammar's grammar for optional
properties grows about with the cube of their number (400: 0.2 s, 800: 1.8 s, the 2,429 a 63 KiB schema
holds: 42 s), where required ones cost next to nothing (OpenAI's strict mode makes every property required).
And so are `pattern`s past a compile-time budget (PATTERN_BUDGET_MS, from measurements on one core): each costs
about 4 ms, plus the square of its largest repetition bound (`[a-z]{0,4000}`: 0.7 s; `{0,10000}`: 5 s), so a
63 KiB schema of patterns could hold a compile thread for minutes.
"""
from __future__ import annotations

import re
from typing import Any

__all__ = ["unenforced"]

UNENFORCED = ("not", "if", "then", "else", "contains", "minContains", "maxContains", "dependentRequired",
              "dependentSchemas", "dependencies")
MAX_DEPTH = 64
MAX_OPTIONAL = 256
PATTERN_BUDGET_MS = 1000.0
_REPEAT = re.compile(r"\{(\d{1,9})(?:,(\d{0,9}))?\}")
NON_NEGATIVE = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
# keywords whose value is a schema, a list of schemas, or a map of name -> schema
_ONE = ("items", "additionalProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
        "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties")


def unenforced(schema: Any) -> str | None:
    """Why xgrammar would not enforce `schema` ("at #/properties/a: ..."), or None when it would."""
    todo: list[tuple[Any, str, int]] = [(schema, "#", 0)]
    pattern_ms = 0.0
    while todo:                     # iterative: a schema may be nested as deep as the request body allows
        node, where, depth = todo.pop()
        if not isinstance(node, dict):
            continue
        if depth > MAX_DEPTH:
            return f"at {where}: nested deeper than {MAX_DEPTH} schemas"
        why = _why(node)
        if why:
            return f"at {where}: {why}"
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            pattern_ms += _pattern_ms(pattern)
            if pattern_ms > PATTERN_BUDGET_MS:
                return (f"at {where}: the schema's patterns would take too long to compile (their repetition "
                        "bounds, as in {0,4000}, and their number); use fewer or smaller ones")
        depth += 1
        for key in _ONE:
            todo.append((node.get(key), f"{where}/{key}", depth))
        for key in _LIST:
            value = node.get(key)
            if isinstance(value, list):
                todo.extend((sub, f"{where}/{key}/{i}", depth) for i, sub in enumerate(value))
        for key in _MAP:
            value = node.get(key)
            if isinstance(value, dict):
                todo.extend((sub, f"{where}/{key}/{name}", depth) for name, sub in value.items())
    return None


def _why(node: dict[str, Any]) -> str | None:
    for key in UNENFORCED:
        if key in node:
            return f"`{key}` is not supported in structured output (the grammar cannot enforce it)"
    if node.get("uniqueItems") is True:
        return "`uniqueItems` is not supported in structured output (the grammar cannot enforce it)"
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return "`allOf` with more than one schema is not supported in structured output; merge them into one"
    for key in NON_NEGATIVE:
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return f"`{key}` must be a non-negative integer"
    required, properties = node.get("required"), node.get("properties")
    if isinstance(properties, dict) and len(properties) > MAX_OPTIONAL:
        optional = len(properties.keys() - set(required if isinstance(required, list) else ()))
        if optional > MAX_OPTIONAL:
            return (f"{optional} optional properties, more than {MAX_OPTIONAL} (their grammar grows with the cube "
                    "of their number); list more of them in `required`")
    if isinstance(required, list) and (isinstance(properties, dict) or node.get("type") == "object"):
        missing = [name for name in required if name not in (properties or {})]
        if missing:
            return (f"`required` names {missing[0]!r}, which `properties` does not define (structured output "
                    "writes only the properties a schema defines)")
    return None


def _pattern_ms(pattern: str) -> float:
    """About how long xgrammar takes to compile one string `pattern` inside a JSON schema, in ms (one core)."""
    largest = max((int(n or m) for m, n in _REPEAT.findall(pattern)), default=0)
    return 4.0 + 4.3e-5 * largest * largest
