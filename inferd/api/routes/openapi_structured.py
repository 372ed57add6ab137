"""/openapi.json for structured output: the rules inferd.api.wire.structured checks after decoding, added to
the schemas msgspec generates from its structs, so the document is exactly as strict as validation.

One rule is written stricter than the server: vLLM's `structured_outputs.json` may be a schema object or
its JSON text, and no JSON Schema keyword can say "a string holding a JSON object", so the document
allows the object only (the server takes both).
"""
from __future__ import annotations

from inferd.api.wire.structured import CONSTRAINTS, NO_OP_OPTIONS

# The name rule as ECMA regex writes it (the struct's is Python's, with \Z).
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
_NOT_NULL = {"not": {"type": "null"}}
_DESCRIPTIONS = {
    "response_format": "The output's format: text (no constraint), json_object (any JSON object), or "
                       "json_schema (the schema's grammar constrains every token; docs/api.md).",
    "structured_outputs": "vLLM's: exactly one of json (a JSON schema), regex, choice, grammar (EBNF) or "
                          "json_object; not with a json_object or json_schema response_format.",
}


def tighten_structured(components: dict, *request_names: str) -> None:
    """The structured-output rules on the components `request_schemas` generated (in place)."""
    so = components["StructuredOutputs"]
    props = so["properties"]
    props["json"] = {"anyOf": [{"type": "object"}, {"type": "null"}], "default": None,
                     "description": "A JSON schema (the server also takes its JSON text, as vLLM does)."}
    props["json_object"] = {"enum": [True, None], "default": None}
    for name, no_op in NO_OP_OPTIONS.items():
        props[name] = {"enum": [None] if no_op is None else [None, no_op], "default": None,
                       "description": "Not implemented by this server: accepted only at its no-op value."}
    # exactly one constraint that is not null
    so["oneOf"] = [{"required": [name], "properties": {name: _NOT_NULL}} for name in CONSTRAINTS]
    components["JsonSchemaFormat"]["properties"]["name"] = {"type": "string", "pattern": NAME_PATTERN}
    for name in request_names:
        schema = components[name]
        for field, text in _DESCRIPTIONS.items():
            schema["properties"][field] = {**schema["properties"][field], "description": text}
        schema.setdefault("allOf", []).append({"not": {
            "required": ["response_format", "structured_outputs"],
            "properties": {"response_format": {"type": "object", "required": ["type"],
                                               "properties": {"type": {"enum": ["json_object", "json_schema"]}}},
                           "structured_outputs": {"type": "object"}}}})
