"""response_format and vLLM's structured_outputs -> Prepared.guided and the field that asked for it."""
from __future__ import annotations

import json

import pytest

from inferd.api.errors import ApiError
from inferd.api.wire.openai import Prepared, decode, prepare
from inferd.api.wire.structured import set_guided
from inferd.types import GuidedDecoding

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def prepared(kind: str, **fields):
    base = CHAT if kind == "chat" else COMPLETION
    return prepare(kind, decode(kind, json.dumps({**base, **fields}).encode()))


def rejected(kind: str, **fields) -> ApiError:
    with pytest.raises(ApiError) as info:
        prepared(kind, **fields)
    assert info.value.status == 400
    return info.value


def schema_format(**json_schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", **json_schema}}


def compact(schema: dict) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def test_a_json_schema_response_format_is_the_schema_as_compact_json():
    p = prepared("chat", response_format=schema_format(schema=PERSON, strict=True, description="a person"))
    assert p.guided == GuidedDecoding(kind="json_schema", spec=compact(PERSON))
    assert p.guided_param == "response_format.json_schema.schema"


def test_the_schemas_key_order_is_kept_because_the_output_follows_the_order_of_its_properties():
    reordered = {**PERSON, "properties": dict(reversed(list(PERSON["properties"].items())))}
    spec = prepared("chat", response_format=schema_format(schema=reordered)).guided.spec
    assert list(json.loads(spec)["properties"]) == ["age", "name"]
    assert prepared("chat", response_format=schema_format(schema=PERSON)).guided.spec == compact(PERSON)


def test_a_json_schema_without_a_schema_allows_any_json_value():
    assert prepared("chat", response_format=schema_format()).guided == GuidedDecoding(kind="json_schema", spec="{}")


def test_json_object_is_any_object_named_by_response_format():
    p = prepared("chat", response_format={"type": "json_object"})
    assert (p.guided, p.guided_param) == (GuidedDecoding(kind="json_object"), "response_format")


def test_text_is_no_constraint():
    p = prepared("chat", response_format={"type": "text"})
    assert p.guided is None and p.guided_param is None


def test_completions_take_response_format_as_vllm_does():
    assert prepared("completion", response_format={"type": "json_object"}).guided.kind == "json_object"


@pytest.mark.parametrize(("response_format", "param", "code"), [
    ({"type": "json_schema"}, "response_format.json_schema", "missing_required_parameter"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name",
     "missing_required_parameter"),
    (schema_format(foo=1), "response_format.json_schema.foo", "unknown_parameter"),
    ({"type": "text", "json_schema": {"name": "x"}}, "response_format.json_schema", "unknown_parameter"),
    ({"type": "xml"}, "response_format.type", "invalid_value"),
    ({"type": "structural_tag"}, "response_format.type", "invalid_value"),
    ({}, "response_format.type", "missing_required_parameter"),
    ({"type": "json_schema", "json_schema": {"name": "has space"}}, "response_format.json_schema.name", "invalid_value"),
    ({"type": "json_schema", "json_schema": {"name": "x" * 65}}, "response_format.json_schema.name", "invalid_value"),
    ({"type": "json_schema", "json_schema": {"name": "x\n"}}, "response_format.json_schema.name", "invalid_value"),
    (schema_format(schema=[1]), "response_format.json_schema.schema", "invalid_value"),
    (schema_format(strict="yes"), "response_format.json_schema.strict", "invalid_value"),
])
def test_a_malformed_response_format_is_a_400_naming_the_field(response_format, param, code):
    err = rejected("chat", response_format=response_format)
    assert (err.param, err.code) == (param, code), err.message


@pytest.mark.parametrize(("constraint", "guided"), [
    ({"json": PERSON}, GuidedDecoding(kind="json_schema", spec=compact(PERSON))),
    ({"json": json.dumps(PERSON, indent=2)}, GuidedDecoding(kind="json_schema", spec=compact(PERSON))),
    ({"regex": "[a-z]{3}"}, GuidedDecoding(kind="regex", spec="[a-z]{3}")),
    ({"choice": ["yes", "no"]}, GuidedDecoding(kind="choice", spec='["yes","no"]')),
    ({"grammar": 'root ::= "a" | "b"'}, GuidedDecoding(kind="grammar", spec='root ::= "a" | "b"')),
    ({"json_object": True}, GuidedDecoding(kind="json_object")),
])
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_vllm_structured_outputs_become_the_grammar_named_by_their_field(kind, constraint, guided):
    p = prepared(kind, structured_outputs=constraint)
    assert (p.guided, p.guided_param) == (guided, f"structured_outputs.{next(iter(constraint))}")


def test_vllm_options_at_their_no_op_values_are_accepted():
    p = prepared("chat", structured_outputs={"regex": "a", "disable_any_whitespace": False,
                                             "disable_additional_properties": False, "whitespace_pattern": None,
                                             "structural_tag": None})
    assert p.guided.kind == "regex"


@pytest.mark.parametrize(("structured_outputs", "param", "code"), [
    ({}, "structured_outputs", "invalid_value"),
    ({"regex": "a", "choice": ["a"]}, "structured_outputs.choice", "conflicting_constraints"),
    ({"grammar": "root ::= \"a\"", "json_object": True}, "structured_outputs.json_object", "conflicting_constraints"),
    ({"json_object": False}, "structured_outputs.json_object", "invalid_value"),
    ({"json": "{not json"}, "structured_outputs.json", "invalid_schema"),
    ({"json": "[1, 2]"}, "structured_outputs.json", "invalid_schema"),
    ({"choice": []}, "structured_outputs.choice", "invalid_value"),
    ({"regex": ""}, "structured_outputs.regex", "invalid_value"),
    ({"regex": "a", "disable_any_whitespace": True}, "structured_outputs.disable_any_whitespace",
     "unsupported_parameter"),
    ({"regex": "a", "structural_tag": "{}"}, "structured_outputs.structural_tag", "unsupported_parameter"),
    ({"regex": "a", "backend": "xgrammar"}, "structured_outputs.backend", "unknown_parameter"),
])
def test_a_malformed_structured_outputs_is_a_400_naming_the_field(structured_outputs, param, code):
    err = rejected("completion", structured_outputs=structured_outputs)
    assert (err.param, err.code) == (param, code), err.message


def test_response_format_and_structured_outputs_together_are_a_400_naming_the_second():
    err = rejected("chat", response_format={"type": "json_object"}, structured_outputs={"choice": ["a"]})
    assert err.param == "structured_outputs.choice" and "response_format" in err.message


def test_a_text_response_format_beside_structured_outputs_is_one_constraint():
    assert prepared("chat", response_format={"type": "text"}, structured_outputs={"regex": "a"}).guided.kind == "regex"


@pytest.mark.parametrize(("old", "new"), [("guided_json", "structured_outputs.json"),
                                          ("guided_regex", "structured_outputs.regex"),
                                          ("guided_choice", "structured_outputs.choice"),
                                          ("guided_grammar", "structured_outputs.grammar")])
def test_vllms_removed_guided_fields_are_unknown_and_the_400_says_what_replaced_them(old, new):
    err = rejected("chat", **{old: "x"})
    assert err.param == old and err.code == "unknown_parameter" and new in err.message


def test_a_schema_nested_past_the_decoders_stack_is_a_400_not_a_500():
    deep = "[" * 100_000 + "]" * 100_000
    body = json.dumps({**CHAT, "response_format": schema_format(schema={"x": 0})}).replace("0", deep, 1)
    with pytest.raises(ApiError) as info:
        decode("chat", body.encode())
    assert info.value.status == 400 and info.value.code == "invalid_json"


def test_a_second_field_asking_for_a_grammar_is_a_400_naming_it():
    p = prepared("chat", response_format={"type": "json_object"})
    with pytest.raises(ApiError) as info:
        set_guided(p, GuidedDecoding(kind="json_schema", spec="{}"), "tool_choice")
    assert info.value.param == "tool_choice" and "response_format" in info.value.message
    fresh = Prepared(kind="chat")
    set_guided(fresh, GuidedDecoding(kind="regex", spec="a"), "structured_outputs.regex")
    assert (fresh.guided.kind, fresh.guided_param) == ("regex", "structured_outputs.regex")
