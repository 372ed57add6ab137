"""The Responses API's function tools onto chat's: the flat shape as the template's tools, tool_choice named by
{type, name}, "auto" allowed without tools, and errors naming the Responses API's own fields."""
from __future__ import annotations

import json

import pytest

from inferd.api.errors import ApiError
from inferd.api.wire.openai import decode_with
from inferd.api.wire.responses_request import decoder, prepare

TOOL = {"type": "function", "name": "get", "description": "d", "strict": True,
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


def prepared(**body):
    return prepare(decode_with(decoder(), json.dumps({"model": "m", "input": "hi", **body}).encode()))[0]


def test_flat_tools_are_the_templates_function_tools_and_auto_is_the_default():
    p = prepared(tools=[TOOL])
    assert p.tools == [{"type": "function", "function": {"name": "get", "description": "d", "strict": True,
                                                         "parameters": TOOL["parameters"]}}]
    assert p.tool_choice == "auto" and p.guided is None and p.parallel_tool_calls


def test_a_named_function_is_constrained_to_its_parameters_and_named_in_grammar_errors():
    p = prepared(tools=[TOOL], tool_choice={"type": "function", "name": "get"}, parallel_tool_calls=False)
    assert (p.tool_choice, p.tool_name, p.parallel_tool_calls) == ("function", "get", False)
    assert json.loads(p.guided.spec) == TOOL["parameters"] and p.guided_param == "tool_choice"


def test_required_replaces_a_text_format_grammar():
    p = prepared(tools=[TOOL], tool_choice="required", text={"format": {"type": "json_object"}})
    assert p.guided.kind == "json_schema" and p.guided_param == "tool_choice"


def test_auto_without_tools_is_the_default_and_none_is_none():
    assert prepared(tool_choice="auto").tools is None
    assert prepared(tools=[TOOL], tool_choice="none").tool_choice == "none"


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{**TOOL, "parameters": {"type": "array"}}]}, "tools[0].parameters"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "get"}}]}, "tools[0].function"),
])
def test_errors_name_the_flat_fields(body, param):
    with pytest.raises(ApiError) as caught:
        prepared(**body)
    assert caught.value.status == 400 and caught.value.param == param
    assert ".function." not in caught.value.message
