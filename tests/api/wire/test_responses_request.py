"""The Responses API's request structs and `prepare`: strict decoding (unknown fields and bad values name
the field), OpenAI parameters accepted only at their no-op value, `input` as chat messages, text.format as
the grammar the output follows."""
from __future__ import annotations

import json

import pytest

from inferd.api.errors import ApiError
from inferd.api.wire.openai import decode_with
from inferd.api.wire.responses_request import decoder, prepare
from inferd.types import GuidedDecoding

DECODER = decoder()


def prepared(**body):
    return prepare(decode_with(DECODER, json.dumps({"model": "m", "input": "hi", **body}).encode()))


def refused(**body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        prepared(**body)
    assert caught.value.status == 400
    return caught.value


def test_a_string_input_is_one_user_message_after_the_instructions():
    p, inputs = prepared(instructions="be brief", max_output_tokens=7, temperature=0.5, top_p=0.9, stream=True)
    assert p.kind == "responses" and p.stream and p.include_usage
    assert p.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert inputs == [{"role": "user", "content": "hi"}]
    assert (p.max_tokens, p.temperature, p.top_p) == (7, 0.5, 0.9)


def test_message_items_keep_their_roles_and_join_their_text_parts():
    p, inputs = prepared(input=[
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "c", "annotations": []}]}])
    assert inputs == [{"role": "system", "content": "rules"}, {"role": "user", "content": "a\nb"},
                      {"role": "assistant", "content": "c"}]
    assert p.messages == inputs


def test_function_calls_join_the_assistant_message_before_them_and_their_outputs_are_tool_messages():
    _, inputs = prepared(input=[
        {"role": "user", "content": "weather?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get", "arguments": '{"city": "Oslo"}', "id": "fc_1",
         "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get", "arguments": "not json"},
        {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "?"}]}])
    assert inputs == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "checking", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": {"city": "Oslo"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
        {"role": "tool", "tool_call_id": "call_2", "content": "?"}]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "role": "user"}]},
     "input[0].role"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({"input": [{"role": "user", "content": "x", "call_id": "c"}]}, "input[0].call_id"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"max_tokens": 3}, "max_tokens"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "user"}]}, "input[0].content"),
    ({"input": [{"content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "file_id": "f"}]}]},
     "input[0].content[0].file_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]},
     "input[0].output[0]"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_text", "text": "x"}, {"type": "input_text", "text": "y", "detail": "high"}]}]},
     "input[0].output[1].detail"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f\n", "arguments": "{}"}]}, "input[0].name"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f<|im_end|>", "arguments": "{}"}]},
     "input[0].name"),
    ({"tools": [{"type": "function", "name": "f\n"}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"$defs": []}}], "tool_choice": "required"},
     "tools[0].parameters.$defs"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"},
                                             {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
     "input[0].content[1]"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type"),
    ({"previous_response_id": "chatcmpl-1"}, "previous_response_id"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"text": {"verbosity": "high"}}, "text.verbosity"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "text", "schema": {}}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}}, "text.format.name"),
])
def test_what_it_cannot_honour_is_a_400_naming_the_field(body, param):
    assert refused(**body).param == param


@pytest.mark.parametrize("body", [
    {"background": False}, {"truncation": "disabled"}, {"top_logprobs": 0}, {"tools": []}, {"tool_choice": "auto"},
    {"service_tier": "auto"}, {"include": []}, {"store": False, "user": "u", "safety_identifier": "s"},
    {"text": {"format": {"type": "text"}, "verbosity": "medium"}}, {"prompt_cache_key": "k"},
])
def test_no_op_values_are_accepted(body):
    assert prepared(**body)[0].guided is None


def test_text_format_json_schema_is_the_grammar_with_its_schema_in_compact_json_keys_in_order():
    p, _ = prepared(text={"format": {"type": "json_schema", "name": "x", "strict": True,
                                     "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}})
    assert p.guided == GuidedDecoding(kind="json_schema", spec='{"type":"object","properties":{"b":{},"a":{}}}')
    assert p.guided_param == "text.format"


def test_text_format_json_object_is_any_json_object():
    p, _ = prepared(text={"format": {"type": "json_object"}})
    assert p.guided == GuidedDecoding(kind="json_object") and p.guided_param == "text.format"
