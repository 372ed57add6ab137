"""Structured output on the wire: `response_format` (OpenAI's) and `structured_outputs` (vLLM's), both
decoded into one GuidedDecoding (inferd.types) and the request field that asked for it.

`response_format` is OpenAI's chat parameter (vLLM accepts it on completions too, and so do we):
{"type": "text"} (no constraint), {"type": "json_object"} (any JSON object), or
{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}. Typed structs, so an
unknown field is a 400 naming it (`response_format.json_schema.foo`) and a missing one too.

`structured_outputs` is vLLM's extension on chat and completions, as vLLM names it today
(vllm/sampling_params.py StructuredOutputsParams, read from chat_completion/protocol.py and
completion/protocol.py): exactly one of `json` (a schema, as an object or JSON text), `regex`, `choice`,
`grammar` (EBNF) or `json_object`. vLLM 0.12 removed the older top-level `guided_json`, `guided_regex`,
`guided_choice` and `guided_grammar` (vLLM PR 29326); they are unknown parameters here, and the 400 says
what replaced each (`legacy_hint`). Two constraints at once are a 400 naming the second.

Whether a grammar compiles (and its size bound) is the engine's to judge (inferd.engine.grammar), in the
pipeline's `grammar` stage: it names `Prepared.guided_param`.
"""
from __future__ import annotations

from typing import Annotated, Any

import msgspec

from inferd.api.errors import invalid
from inferd.api.wire.json_depth import depth_exceeds, too_deep_message
from inferd.api.wire.strict import STRICT
from inferd.types import GuidedDecoding

_TAGGED = dict(STRICT, tag_field="type")
# OpenAI's rule for a response format's name (their API's 400 quotes this pattern). \Z, not $: Python's $
# also matches before a final newline; /openapi.json writes it with $ (ECMA's, which does not).
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}\Z"
# vLLM's constraints, in the order a request's two are judged (the second is the one named).
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")
# vLLM's options beside the constraint that inferd does not implement: accepted only at their no-op value.
NO_OP_OPTIONS = {"disable_any_whitespace": False, "disable_additional_properties": False,
                 "whitespace_pattern": None, "structural_tag": None}
# vLLM's pre-0.12 top-level fields -> what replaced them (named in the 400 for the old name).
LEGACY_FIELDS = {"guided_json": "structured_outputs.json", "guided_regex": "structured_outputs.regex",
                 "guided_choice": "structured_outputs.choice", "guided_grammar": "structured_outputs.grammar",
                 "guided_whitespace_pattern": "structured_outputs.whitespace_pattern",
                 "guided_decoding_backend": None}


class JsonSchemaFormat(msgspec.Struct, **STRICT):
    """response_format.json_schema, as OpenAI's API takes it."""

    name: Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
    description: str | None = None          # OpenAI shows it to its model; ours sees only the grammar
    schema: dict[str, Any] | None = None    # absent: any JSON value (the empty schema)
    strict: bool | None = None              # the output follows the schema whatever it says (docs/api.md)


class TextFormat(msgspec.Struct, tag="text", **_TAGGED):
    """Free text: no constraint."""


class JsonObjectFormat(msgspec.Struct, tag="json_object", **_TAGGED):
    """Any JSON object."""


class JsonSchemaResponseFormat(msgspec.Struct, tag="json_schema", **_TAGGED):
    json_schema: JsonSchemaFormat


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaResponseFormat


class StructuredOutputs(msgspec.Struct, **STRICT):
    """vLLM's `structured_outputs`: one constraint, and vLLM's options at their no-op values."""

    json: str | dict[str, Any] | None = None
    regex: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    choice: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    grammar: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    json_object: bool | None = None         # only true: false would name no constraint
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


def guided_for(response_format: ResponseFormat | None,
               structured: StructuredOutputs | None) -> tuple[GuidedDecoding, str] | None:
    """The request's grammar and the field that asked for it (None: free text); 400 for two at once."""
    found: list[tuple[GuidedDecoding, str]] = []
    if response_format is not None:
        found += _from_response_format(response_format)
    if structured is not None:
        found += _from_structured_outputs(structured)
    if len(found) > 1:
        first, second = found[0][1], found[1][1]
        raise invalid(f"{second}: only one constraint on the output per request; {first} already sets one.",
                      param=second, code="conflicting_constraints")
    return found[0] if found else None


def set_guided(out: Any, guided: GuidedDecoding, param: str) -> None:
    """Give `out` (a Prepared) its grammar, asked for by `param`; a 400 naming `param` when another field set
    one already (tool_choice "required" beside a json_schema response_format, say): one grammar per output."""
    if out.guided is not None:
        raise invalid(f"{param}: only one constraint on the output per request; {out.guided_param} already sets "
                      "one.", param=param, code="conflicting_constraints")
    out.guided, out.guided_param = guided, param


def _from_response_format(fmt: ResponseFormat) -> list[tuple[GuidedDecoding, str]]:
    if isinstance(fmt, JsonObjectFormat):
        return [(GuidedDecoding(kind="json_object"), "response_format")]
    if isinstance(fmt, JsonSchemaResponseFormat):
        schema = {} if fmt.json_schema.schema is None else fmt.json_schema.schema
        return [(GuidedDecoding(kind="json_schema", spec=compact(schema)), "response_format.json_schema.schema")]
    return []


def _from_structured_outputs(so: StructuredOutputs) -> list[tuple[GuidedDecoding, str]]:
    for name, no_op in NO_OP_OPTIONS.items():
        value = getattr(so, name)
        if value is not None and value != no_op:
            say = "null" if no_op is None else f"null or {str(no_op).lower()}"
            raise invalid(f"structured_outputs.{name}: not supported by this server; only {say} is accepted.",
                          param=f"structured_outputs.{name}", code="unsupported_parameter")
    if so.json_object is False:
        raise invalid("structured_outputs.json_object: only true is accepted (omit it for no constraint).",
                      param="structured_outputs.json_object", code="invalid_value")
    found = []
    for name in CONSTRAINTS:
        value = getattr(so, name)
        if value is not None:
            found.append((_constraint(name, value), f"structured_outputs.{name}"))
    if not found:
        raise invalid("structured_outputs: name one constraint (json, regex, choice, grammar or json_object).",
                      param="structured_outputs", code="invalid_value")
    return found


def _constraint(name: str, value: Any) -> GuidedDecoding:
    if name == "json":
        return GuidedDecoding(kind="json_schema", spec=compact(_schema_object(value)))
    if name == "choice":
        return GuidedDecoding(kind="choice", spec=msgspec.json.encode(value).decode())
    if name == "json_object":
        return GuidedDecoding(kind="json_object")
    return GuidedDecoding(kind=name, spec=value)        # regex, grammar: the text itself


def _schema_object(value: str | dict[str, Any]) -> dict[str, Any]:
    """structured_outputs.json: a schema object, or (as vLLM takes it) its JSON text."""
    if isinstance(value, dict):
        return value
    if depth_exceeds(value.encode()):       # JSON text inside a string: the body's own bound did not see it
        raise invalid(f"structured_outputs.json: {too_deep_message('the schema')}", param="structured_outputs.json",
                      code="invalid_schema")
    try:
        schema = msgspec.json.decode(value)
    except msgspec.DecodeError as exc:
        raise invalid(f"structured_outputs.json: not valid JSON ({exc}).", param="structured_outputs.json",
                      code="invalid_schema") from None
    if not isinstance(schema, dict):
        raise invalid("structured_outputs.json: a JSON schema is a JSON object.", param="structured_outputs.json",
                      code="invalid_schema")
    return schema


def compact(schema: dict[str, Any]) -> str:
    """The schema as compact JSON, keys in the client's order: not sorted, because xgrammar writes an object's
    keys in the order of its schema's `properties` and OpenAI documents that the output keeps the schema's
    order (a schema putting `reasoning` before `answer` relies on it). The same schema sent again, as one
    client's code does, is the same text, so it is one entry of the engine's compile cache."""
    return msgspec.json.encode(schema).decode()


def legacy_hint(param: str) -> str:
    """For an unknown parameter that older vLLM accepted: what to send instead ("" for any other)."""
    if param not in LEGACY_FIELDS:
        return ""
    new = LEGACY_FIELDS[param]
    if new is None:
        return f" (vLLM removed `{param}` in 0.12; the server chooses the grammar backend.)"
    return f" (vLLM removed `{param}` in 0.12; send `{new}` instead.)"
