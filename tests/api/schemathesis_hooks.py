"""Schemathesis hooks for test_openapi_schemathesis (loaded by `st run` through SCHEMATHESIS_HOOKS).

JSON Schema cannot tell `2.0` from `2`: both are the integer 2, so schemathesis sends integers
spelled as floats to check that a server reading JSON accepts them. inferd's decoder does not (it
refuses `"max_tokens": 2.0` with a 400 naming the field, as msgspec's strict decoding does), and
no schema keyword can say so. This hook respells every whole float as the integer it equals; the
schema cannot tell the difference, so no request changes from valid to invalid or back.

A chat (or Responses API) request's `tool_choice` naming a function must name one of its `tools`: JSON Schema cannot compare
two values of one body, so the schema allows any name and the server answers a documented 400 for an
undeclared one. This hook renames such a choice to the first declared tool, the only way the schema's
valid requests can be ones the server accepts.

`tool_choice` other than "none" needs `tools`: the published schema says so (a rule in the chat request's
`allOf`, kept exact for clients and for test_openapi_strictness), but with it beside the chat schema's other
cross-field rules jsonschema_rs, which schemathesis canonicalizes schemas with before generating, gives up
(`outgrew_intersections`: no form it can generate from) and schemathesis reports the operation as unsupported.
So the generator's copy of the document leaves that one rule out (`before_load_schema`), and the body hook keeps
every generated request within it: a tool_choice without tools becomes "none", the value the rule allows.
"""
from __future__ import annotations

from typing import Any

import schemathesis


def _as_ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, list):
        return [_as_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_ints(v) for k, v in value.items()}
    return value


def _is_tools_rule(rule: Any) -> bool:
    """The chat schema's `allOf` rule "tool_choice other than none only with tools" (inferd.api.routes.openapi).
    The Responses API's rule ("none" or "auto" without tools) stays: beside its schema's fewer rules the generator
    copes with it, and its coverage phase (which runs no hooks) needs it."""
    branches = rule.get("anyOf") if isinstance(rule, dict) else None
    return isinstance(branches, list) and any(b.get("required") == ["tools"] for b in branches if isinstance(b, dict)) \
        and not any(b.get("properties", {}).get("tool_choice", {}).get("enum") == [None, "none", "auto"]
                    for b in branches if isinstance(b, dict))


@schemathesis.hook
def before_load_schema(context: schemathesis.HookContext, raw_schema: dict) -> None:
    for schema in raw_schema.get("components", {}).get("schemas", {}).values():
        if isinstance(schema, dict) and isinstance(schema.get("allOf"), list):
            schema["allOf"] = [rule for rule in schema["allOf"] if not _is_tools_rule(rule)]


def _tool_choice_with_tools(body: Any) -> Any:
    if isinstance(body, dict) and body.get("tool_choice") not in (None, "none") and not body.get("tools"):
        body = {**body, "tool_choice": "none"}
    return body


def _named_tool_declared(body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    choice, tools = body.get("tool_choice"), body.get("tools")
    if not (isinstance(choice, dict) and isinstance(tools, list) and tools and isinstance(tools[0], dict)):
        return body
    first = tools[0]
    if isinstance(choice.get("function"), dict):        # chat's shape: {type, function: {name}}
        name = first.get("function", {}).get("name") if isinstance(first.get("function"), dict) else None
        if isinstance(name, str):
            body = {**body, "tool_choice": {**choice, "function": {**choice["function"], "name": name}}}
    elif isinstance(first.get("name"), str):            # the Responses API's flat shape: {type, name}
        body = {**body, "tool_choice": {**choice, "name": first["name"]}}
    return body


@schemathesis.hook
def map_body(context: schemathesis.HookContext, body: Any) -> Any:
    return _tool_choice_with_tools(_named_tool_declared(_as_ints(body)))
