"""The request schemas in /openapi.json allow exactly what validation accepts, case by case.

Fast and deterministic beside the schemathesis run (test_openapi_schemathesis.py): each body below is
judged by the published schema and by the real app, and the two must agree. Model `m` is not served,
so a body validation accepts ends in a 404 (routing), one it refuses in a 400 naming the field.
"""
from __future__ import annotations

import json

import jsonschema_rs  # installed with schemathesis (the test extra); validates OpenAPI 3.1 schemas
import pytest

COMPLETION = {"model": "m", "prompt": "x"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
RESPONSE = {"model": "m", "input": "x"}


TOOL = {"type": "function", "function": {"name": "f", "description": "d", "strict": True,
                                         "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _message(**fields) -> dict:
    return {**CHAT, "messages": [{"role": "user", "content": "x", **fields}]}


_SCHEMA = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}
STRUCTURED_CASES = [
    # response_format and vLLM's structured_outputs (inferd.api.wire.structured)
    ("chat/completions", {**CHAT, "response_format": _SCHEMA}),
    ("completions", {**COMPLETION, "response_format": _SCHEMA}),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema"}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "a\n"}}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x" * 64}}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                            "foo": 1}}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                            "schema": []}}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "text", "json_schema": {"name": "x"}}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "structural_tag"}}),
    ("chat/completions", {**CHAT, "response_format": {}}),
    ("completions", {**COMPLETION, "structured_outputs": {"regex": "a+"}}),
    ("completions", {**COMPLETION, "structured_outputs": {"choice": ["a", "b"]}}),
    ("completions", {**COMPLETION, "structured_outputs": {"json": {"type": "object"}, "regex": None}}),
    ("completions", {**COMPLETION, "structured_outputs": {"grammar": "root ::= \"a\""}}),
    ("completions", {**COMPLETION, "structured_outputs": {"json_object": True}}),
    ("completions", {**COMPLETION, "structured_outputs": {"json_object": False}}),
    ("completions", {**COMPLETION, "structured_outputs": {}}),
    ("completions", {**COMPLETION, "structured_outputs": {"regex": "a", "choice": ["a"]}}),
    ("completions", {**COMPLETION, "structured_outputs": {"choice": []}}),
    ("completions", {**COMPLETION, "structured_outputs": {"regex": ""}}),
    ("completions", {**COMPLETION, "structured_outputs": {"json": 3}}),
    ("completions", {**COMPLETION, "structured_outputs": {"regex": "a", "disable_any_whitespace": False}}),
    ("completions", {**COMPLETION, "structured_outputs": {"regex": "a", "disable_any_whitespace": True}}),
    ("completions", {**COMPLETION, "structured_outputs": {"regex": "a", "whitespace_pattern": " "}}),
    ("completions", {**COMPLETION, "structured_outputs": {"regex": "a", "structural_tag": None}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "text"}, "structured_outputs": {"regex": "a"}}),
    ("chat/completions", {**CHAT, "guided_json": {"type": "object"}}),
]

CASES = [
    # (path, body); the expected answer is whatever the schema says, checked against the server
    ("completions", {**COMPLETION, "prompt": ""}),
    ("completions", {**COMPLETION, "prompt": []}),
    ("completions", {**COMPLETION, "prompt": [""]}),
    ("completions", {**COMPLETION, "prompt": [[]]}),
    ("completions", {**COMPLETION, "prompt": [1, "a"]}),
    ("completions", {**COMPLETION, "prompt": ["a"] * 65}),
    ("completions", {**COMPLETION, "prompt": ["a"] * 64}),
    ("completions", {**COMPLETION, "prompt": [1, 2]}),
    ("completions", {**COMPLETION, "prompt": [[1], [2]]}),
    ("completions", {**COMPLETION, "stop": ""}),
    ("completions", {**COMPLETION, "stop": [""]}),
    ("completions", {**COMPLETION, "stop": "x" * 257}),
    ("completions", {**COMPLETION, "stop": ["x" * 256]}),
    ("completions", {**COMPLETION, "stop": []}),
    ("completions", {**COMPLETION, "n": 2}),
    ("completions", {**COMPLETION, "n": 1}),
    ("completions", {**COMPLETION, "n": 16}),
    ("completions", {**COMPLETION, "n": 17}),
    ("completions", {**COMPLETION, "n": 0}),
    ("chat/completions", {**CHAT, "n": 3}),
    ("chat/completions", {**CHAT, "n": 17}),
    ("completions", {**COMPLETION, "best_of": 1}),
    ("completions", {**COMPLETION, "presence_penalty": 0.5}),
    ("completions", {**COMPLETION, "presence_penalty": 0.0}),
    ("completions", {**COMPLETION, "logit_bias": {"1": 1.0}}),
    ("completions", {**COMPLETION, "logit_bias": {}}),
    ("completions", {**COMPLETION, "presence_penalty": 2.5}),
    ("completions", {**COMPLETION, "frequency_penalty": -2}),
    ("completions", {**COMPLETION, "logit_bias": {"1": 101}}),
    ("completions", {**COMPLETION, "logit_bias": {"01": 1}}),
    ("completions", {**COMPLETION, "logit_bias": {"x": 1}}),
    ("completions", {**COMPLETION, "logit_bias": {str(i): 1 for i in range(301)}}),
    ("completions", {**COMPLETION, "top_k": -1}),
    ("completions", {**COMPLETION, "top_k": -2}),
    ("completions", {**COMPLETION, "min_p": 1.5}),
    ("completions", {**COMPLETION, "repetition_penalty": 0}),
    ("chat/completions", {**CHAT, "repetition_penalty": 1.2, "min_p": 0.1, "top_k": 5}),
    ("completions", {**COMPLETION, "echo": True}),
    ("completions", {**COMPLETION, "suffix": "x"}),
    ("completions", {**COMPLETION, "suffix": ""}),
    ("completions", {**COMPLETION, "logprobs": 0}),
    ("completions", {**COMPLETION, "logprobs": 5, "echo": True}),
    ("completions", {**COMPLETION, "logprobs": 6}),
    ("completions", {**COMPLETION, "logprobs": -1}),
    ("completions", {**COMPLETION, "stream_options": {}}),
    ("completions", {**COMPLETION, "stream": False, "stream_options": {"include_usage": True}}),
    ("completions", {**COMPLETION, "stream": True, "stream_options": {"include_usage": True}}),
    ("completions", {**COMPLETION, "stream_options": None}),
    ("completions", {**COMPLETION, "stream": True, "stream_options": {"include_obfuscation": True}}),
    ("completions", {**COMPLETION, "stream": True, "stream_options": {"include_obfuscation": False}}),
    ("completions", {**COMPLETION, "model": ""}),
    ("completions", {**COMPLETION, "model": " "}),
    ("completions", {**COMPLETION, "model": "a@"}),
    ("completions", {**COMPLETION, "model": "a@b@c"}),
    ("completions", {**COMPLETION, "model": "a:"}),
    ("completions", {**COMPLETION, "model": ":x"}),
    ("completions", {**COMPLETION, "model": "a@b:c"}),
    ("completions", {**COMPLETION, "model": "a:b@c:d"}),
    ("chat/completions", _message(role="tool")),
    ("chat/completions", _message(role="function")),
    ("chat/completions", _message(role="developer")),
    ("chat/completions", {**CHAT, "messages": []}),
    ("chat/completions", {**CHAT, "messages": [{"role": "user"}]}),
    ("chat/completions", {**CHAT, "messages": [{"role": "assistant"}]}),
    ("chat/completions", _message(content=[{"type": "image_url"}])),
    ("chat/completions", _message(content=[{"type": "text"}])),
    ("chat/completions", _message(content=[{"type": "text", "text": "a", "image_url": {}}])),
    ("chat/completions", _message(content=[{"type": "text", "text": "a", "refusal": None}])),
    ("chat/completions", _message(content=[])),
    ("chat/completions", _message(tool_calls=[])),
    ("chat/completions", _message(tool_calls=[{}])),
    ("chat/completions", _message(refusal="")),
    ("chat/completions", _message(tool_call_id="x")),
    ("chat/completions", _message(function_call="none")),
    ("chat/completions", _message(audio=[])),
    ("chat/completions", {**CHAT, "max_tokens": 3, "max_completion_tokens": 4}),
    ("chat/completions", {**CHAT, "max_tokens": 3, "max_completion_tokens": None}),
    ("chat/completions", {**CHAT, "tool_choice": "none"}),
    ("chat/completions", {**CHAT, "tool_choice": "auto"}),
    ("chat/completions", {**CHAT, "tools": []}),
    ("chat/completions", {**CHAT, "tools": [{}]}),
    ("chat/completions", {**CHAT, "response_format": {"type": "text"}}),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_object"}}),
    ("chat/completions", {**CHAT, "modalities": ["text"]}),
    ("chat/completions", {**CHAT, "modalities": ["audio"]}),
    ("chat/completions", {**CHAT, "service_tier": "default"}),
    ("chat/completions", {**CHAT, "service_tier": "flex"}),
    ("chat/completions", {**CHAT, "logprobs": False}),
    ("chat/completions", {**CHAT, "logprobs": True}),
    ("chat/completions", {**CHAT, "top_logprobs": 0}),
    ("chat/completions", {**CHAT, "top_logprobs": 1}),
    ("chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 20}),
    ("chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}),
    ("chat/completions", {**CHAT, "logprobs": False, "top_logprobs": 0}),
    ("chat/completions", {**CHAT, "logprobs": None, "top_logprobs": None}),
    ("chat/completions", {**CHAT, "reasoning_effort": "low"}),
    ("chat/completions", {**CHAT, "store": False}),
    ("chat/completions", {**CHAT, "store": True}),
    ("chat/completions", {**CHAT, "prompt_cache_retention": "in_memory"}),
    ("chat/completions", {**CHAT, "prompt_cache_retention": "24h"}),
    ("responses", {**RESPONSE, "input": ""}),
    ("responses", {**RESPONSE, "input": []}),
    ("responses", {**RESPONSE, "input": [{"role": "user", "content": "x"}]}),
    ("responses", {**RESPONSE, "input": [{"type": "message", "role": "developer", "content": "x"}]}),
    ("responses", {**RESPONSE, "input": [{"role": "user"}]}),
    ("responses", {**RESPONSE, "input": [{"content": "x"}]}),
    ("responses", {**RESPONSE, "input": [{"role": "tool", "content": "x"}]}),
    ("responses", {**RESPONSE, "input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}),
    ("responses", {**RESPONSE, "input": [{"role": "assistant", "content": [
        {"type": "output_text", "text": "x", "annotations": []}], "id": "msg_1", "status": "completed"}]}),
    ("responses", {**RESPONSE, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
    ("responses", {**RESPONSE, "input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
    ("responses", {**RESPONSE, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "x", "file_id": "f"}]}]}),
    ("responses", {**RESPONSE, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                                         {"type": "function_call_output", "call_id": "c", "output": "ok"}]}),
    ("responses", {**RESPONSE, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
    ("responses", {**RESPONSE, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}",
                                          "role": "user"}]}),
    ("responses", {**RESPONSE, "input": [{"type": "function_call_output", "call_id": "c"}]}),
    ("responses", {**RESPONSE, "input": [{"role": "user", "content": "x", "call_id": "c"}]}),
    ("responses", {**RESPONSE, "input": [{"type": "message", "role": "user", "content": "x", "output": None}]}),
    ("responses", {**RESPONSE, "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}),
    ("responses", {**RESPONSE, "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"}),
    ("responses", {**RESPONSE, "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function",
                                                                                           "name": "f"}}),
    ("responses", {**RESPONSE, "tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]}),
    ("responses", {**RESPONSE, "tools": [{"type": "function", "name": "a b"}]}),
    ("responses", {**RESPONSE, "tools": [{"type": "web_search"}]}),
    ("responses", {**RESPONSE, "tools": [{"type": "function", "function": {"name": "f"}}]}),
    ("responses", {**RESPONSE, "tool_choice": "required"}),
    ("responses", {**RESPONSE, "tool_choice": "auto"}),
    ("responses", {**RESPONSE, "tool_choice": {"type": "function", "name": "f"}}),
    ("responses", {**RESPONSE, "max_output_tokens": 0}),
    ("responses", {**RESPONSE, "max_output_tokens": 16, "temperature": 0, "top_p": 0.5, "instructions": "be"}),
    ("responses", {**RESPONSE, "max_tokens": 16}),
    ("responses", {**RESPONSE, "store": False, "metadata": {"k": "v"}}),
    ("responses", {**RESPONSE, "metadata": {str(i): "v" for i in range(17)}}),
    ("responses", {**RESPONSE, "previous_response_id": "resp_abc"}),
    ("responses", {**RESPONSE, "previous_response_id": "chatcmpl-1"}),
    ("responses", {**RESPONSE, "text": {"format": {"type": "text"}}}),
    ("responses", {**RESPONSE, "text": {"format": {"type": "text", "name": "x"}}}),
    ("responses", {**RESPONSE, "text": {"format": {"type": "json_object"}}}),
    ("responses", {**RESPONSE, "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}),
    ("responses", {**RESPONSE, "text": {"format": {"type": "json_schema", "name": "x"}}}),
    ("responses", {**RESPONSE, "text": {"format": {"type": "json_schema", "name": None, "schema": {}}}}),
    ("responses", {**RESPONSE, "text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}}),
    ("responses", {**RESPONSE, "text": {"verbosity": "low"}}),
    ("responses", {**RESPONSE, "tool_choice": "auto", "tools": []}),
    ("responses", {**RESPONSE, "background": True}),
    ("responses", {**RESPONSE, "truncation": "auto"}),
    ("responses", {**RESPONSE, "truncation": "disabled"}),
    ("responses", {**RESPONSE, "reasoning": {"effort": "low"}}),
    ("responses", {**RESPONSE, "stream_options": {"include_obfuscation": False}}),
    ("responses", {**RESPONSE, "stream": True, "stream_options": {"include_obfuscation": False}}),
    ("chat/completions", {**CHAT, "tools": [TOOL]}),
    ("chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False}),
    ("chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}),
    ("chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": "sometimes"}),
    ("chat/completions", {**CHAT, "tools": [TOOL] * 129}),
    ("chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}]}),
    ("chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "array"}}}]}),
    ("chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
    ("chat/completions", {**CHAT, "tool_choice": "required"}),
    ("chat/completions", {**CHAT, "parallel_tool_calls": False}),
    ("chat/completions", {**CHAT, "messages": [{"role": "tool", "content": "x", "tool_call_id": "c"}]}),
    ("chat/completions", {**CHAT, "messages": [{"role": "tool", "content": "x"}]}),
    ("chat/completions", {**CHAT, "messages": [{"role": "tool", "tool_call_id": "c"}]}),
    ("chat/completions", {**CHAT, "messages": [{"role": "assistant", "tool_calls": [CALL]}]}),
    ("chat/completions", {**CHAT, "messages": [{"role": "assistant", "tool_calls": [CALL], "tool_call_id": "c"}]}),
    ("chat/completions", {**CHAT, "messages": [{"role": "assistant", "tool_calls": [{**CALL, "type": "x"}]}]}),
    ("chat/completions", _message(tool_calls=[CALL])),
    ("chat/completions", {**CHAT, "messages": [{"role": "tool", "content": "x", "tool_call_id": "c",
                                                "tool_calls": [CALL]}]}),
    *STRUCTURED_CASES,
]


async def _validator(served, path: str) -> jsonschema_rs.Validator:
    async with served.http.get(served.base_url + "/openapi.json") as resp:
        doc = await resp.json()
    ref = doc["paths"][f"/v1/{path}"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return jsonschema_rs.Draft202012Validator({"components": doc["components"], "$ref": ref})


async def _status(served, path: str, body: dict) -> tuple[int, dict]:
    async with served.http.post(f"{served.base_url}/v1/{path}", json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(("path", "body"), CASES, ids=lambda v: json.dumps(v)[:80] if isinstance(v, dict) else v)
async def test_the_schema_allows_a_request_exactly_when_validation_accepts_it(served, path, body):
    allowed = (await _validator(served, path)).is_valid(body)
    status, answer = await _status(served, path, body)
    assert status in (400, 404), answer
    assert (status == 404) == allowed, (allowed, answer)


async def test_where_no_schema_can_say_the_rule_the_document_is_the_stricter(served):
    """An equal max_tokens/max_completion_tokens pair passes validation; the schema says "send one"."""
    body = {**CHAT, "max_tokens": 3, "max_completion_tokens": 3}
    assert not (await _validator(served, "chat/completions")).is_valid(body)
    assert (await _status(served, "chat/completions", body))[0] == 404


async def test_an_integer_spelled_as_a_float_is_refused_though_json_schema_calls_it_an_integer(served):
    """Why schemathesis_hooks.py respells whole floats: `2.0` is the integer 2 to JSON Schema, a float to msgspec."""
    body = {**COMPLETION, "max_tokens": 2.0}
    assert (await _validator(served, "completions")).is_valid(body)
    status, answer = await _status(served, "completions", body)
    assert status == 400 and answer["error"]["param"] == "max_tokens"


async def test_vllms_json_text_for_a_schema_is_accepted_though_the_document_allows_only_the_object(served):
    """No JSON Schema keyword can say "a string holding a JSON object": the document is the stricter."""
    body = {**COMPLETION, "structured_outputs": {"json": '{"type": "object"}'}}
    assert not (await _validator(served, "completions")).is_valid(body)
    assert (await _status(served, "completions", body))[0] == 404
