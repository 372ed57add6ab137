"""The Responses API's operations in the OpenAPI document (inferd.api.routes.openapi merges them in).

POST /v1/responses's schema is generated from ResponsesRequest, the struct its decoder uses, with the rules
`prepare` checks after decoding added (no-op-only parameters, message items with a role and content, text
parts only, text.format's fields per type, `stream_options` only with `stream`), so a body the schema allows
is one validation accepts. What no schema can say is a documented 400/404: `store: true` for a tenant whose
retention keeps no text, a previous_response_id that is not the caller's (404), and what depends on the model.
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from inferd.api.routes.openapi_structured import NAME_PATTERN
from inferd.api.routes.stored_responses import NO_OP_QUERY
from inferd.api.wire.tools import MAX_TOOLS
from inferd.api.wire.responses_items import ITEM_FIELDS, NON_TEXT_FIELDS, TEXT_PART_TYPES
from inferd.api.wire.responses_request import NO_OP_VALUES, ResponsesRequest

_TEXT_FORMAT_ONLY = ("name", "schema", "strict", "description")


def _no_op(values: tuple, say: str) -> dict:
    return {"enum": [None, *values], "default": None, "description": f"Not implemented by this server: accepted only as {say}."}


def _tighten(components: dict, name: str, model: dict) -> None:
    props = components[name]["properties"]
    props["model"] = model
    for field, (values, say) in NO_OP_VALUES.items():
        props[field] = _no_op(values, say)
    input_schema = props["input"]["anyOf"]
    props["input"] = {"anyOf": [{"type": "string", "minLength": 1} if s.get("type") == "string" else s
                                for s in input_schema]}
    props["previous_response_id"] = {"anyOf": [{"type": "string", "pattern": r"^resp_[A-Za-z0-9]{1,64}$"},
                                               {"type": "null"}], "default": None}
    components[name]["anyOf"] = [{"properties": {"stream": {"const": True}}, "required": ["stream"]},
                                 {"properties": {"stream_options": {"type": "null"}}}]
    components["ResponseInputItem"] = _item_schema(components["ResponseInputItem"])
    part = components["ResponseInputPart"]
    part["properties"].update({"type": {"enum": list(TEXT_PART_TYPES)}, "text": {"type": "string"},
                               **{f: {"type": "null", "default": None} for f in NON_TEXT_FIELDS}})
    part["required"] = ["type", "text"]
    _tighten_tools(components, name)
    fmt = components["ResponseTextFormat"]
    fmt["properties"]["name"] = {"anyOf": [{"type": "string", "pattern": NAME_PATTERN}, {"type": "null"}],
                                 "default": None}
    fmt["oneOf"] = [
        {"properties": {"type": {"const": "json_schema"}, "name": {"type": "string"}, "schema": {"type": "object"}},
         "required": ["type", "name", "schema"]},
        {"properties": {"type": {"enum": ["text", "json_object"]},
                        **{f: {"type": "null"} for f in _TEXT_FORMAT_ONLY}}}]
    components["ResponseTextConfig"]["properties"]["verbosity"] = {"enum": [None, "medium"], "default": None}
    components["ResponseStreamOptions"]["properties"]["include_obfuscation"] = {"enum": [None, False], "default": None}


def _tighten_tools(components: dict, name: str) -> None:
    """chat's `prepare_tools` rules (inferd.api.routes.openapi._tighten_tools) on the flat shape: parameters are
    an object's schema; tool_choice other than "none" or "auto" only with tools. That a named tool_choice names
    one of the tools is a documented 400 (JSON Schema cannot compare two values of a body)."""
    params = components["ResponseFunctionTool"]["properties"]["parameters"]
    params["anyOf"] = [{"type": "object", "properties": {"type": {"const": "object"}}}, {"type": "null"}]
    components[name]["properties"]["tools"]["anyOf"][0]["maxItems"] = MAX_TOOLS
    components[name].setdefault("allOf", []).append({"anyOf": [
        {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
        {"properties": {"tool_choice": {"enum": [None, "none", "auto"]}}}]})


def _item_schema(generated: dict) -> dict:
    """One variant per item type (a message's `type` may be absent): its own fields required and not null,
    the other types' fields null (inferd.api.wire.responses_request._ITEM_FIELDS)."""
    props = generated["properties"]
    base = {k: v for k, v in generated.items() if k not in ("properties", "required", "title")}
    variants = []
    for kind, (required, foreign) in ITEM_FIELDS.items():
        own = {name: {"anyOf": [t for t in props[name].get("anyOf", [props[name]]) if t != {"type": "null"}]}
               for name in required}
        if kind == "message":
            own["role"] = {"enum": ["user", "assistant", "system", "developer"]}
        kind_schema = {"enum": [None, kind]} if kind == "message" else {"const": kind}
        variants.append({**base, "properties": {**props, **own, "type": kind_schema,
                                                **{name: {"type": "null"} for name in foreign}},
                         "required": [*required] if kind == "message" else ["type", *required]})
    return {"title": generated["title"], "anyOf": variants}


def responses_paths(model: dict, ref: str, errors: Callable[..., dict], generate_errors: tuple[str, ...],
                    components: dict) -> dict:
    """The paths, after adding ResponsesRequest's schemas to `components` (`ref`: the $ref template)."""
    (request,), generated = msgspec.json.schema_components([ResponsesRequest], ref_template=ref)
    components.update(generated)
    name = request["$ref"].rsplit("/", 1)[1]
    _tighten(components, name, model)
    response_id = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    ok = {"application/json": {"schema": {"type": "object"}}}
    stream = "text/event-stream"
    return {
        "/v1/responses": {"post": {
            "summary": "Create a model response (OpenAI's Responses API)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": ref.format(name=name)}}}},
            "responses": {"200": {"description": "A `response` object, or with `stream: true` its typed events "
                                                 "(`event: response.created` ... `response.completed`), each with "
                                                 "a sequence_number; no [DONE]",
                                  "headers": {"X-Request-Id": {"schema": {"type": "string"}},
                                              "X-Inferd-Model-Version": {"schema": {"type": "string"}}},
                                  "content": {**ok, stream: {"schema": {"type": "string"}}}},
                          **errors(*generate_errors)}}},
        "/v1/responses/{response_id}": {
            "get": {"summary": "A stored response (the caller's, still within its retention)",
                    "parameters": [response_id, *({"name": q, "in": "query", "required": False,
                                                   "schema": {"enum": ["false"]}} for q in NO_OP_QUERY)],
                    "responses": {"200": {"description": "The `response` object", "content": ok},
                                  **errors("400", "401", "403", "404", "500", "503")}},
            "delete": {"summary": "Delete a stored response", "parameters": [response_id],
                       "responses": {"200": {"description": "{id, object: response, deleted: true}", "content": ok},
                                     **errors("401", "403", "404", "500", "503")}},
        },
    }
