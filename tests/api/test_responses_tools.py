"""Function tools on /v1/responses through the real daemon and the official SDK: a tool loop (tool_choice
"required" makes the call, its function_call_output comes back by previous_response_id or in a stateless
history, the model answers), streamed and not; a named function; arguments streamed in pieces."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.api.batch_harness import serve

KEPT = '[tenants.local]\nretention = "1h"\n'

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The forecast", "parameters": WEATHER,
          "strict": True}]


async def _create(sdk, stream: bool, **kw):
    """The whole response, streamed (the closing event's, response.completed or .incomplete) or not."""
    if not stream:
        return await sdk.responses.create(**kw)
    events = [event async for event in await sdk.responses.create(stream=True, **kw)]
    assert events[-1].type in ("response.completed", "response.incomplete")
    return events[-1].response


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_loop_a_required_call_then_its_output_by_previous_response_id_then_an_answer(tmp_path, stream):
    async with serve(tmp_path, KEPT) as (node, _):
        sdk = node.sdk()
        first = await _create(sdk, stream, model="sim", input="Weather in Paris?", tools=TOOLS,
                              tool_choice="required", parallel_tool_calls=False, max_output_tokens=200)
        [call] = first.output
        assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), WEATHER)
        answer = await _create(sdk, stream, model="sim", previous_response_id=first.id, tools=TOOLS,
                               tool_choice="none", max_output_tokens=6,
                               input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert first.status == "completed" and first.tools[0].name == "get_weather"
    assert answer.output[0].type == "message" and answer.output_text
    assert answer.usage.input_tokens > first.usage.input_tokens     # the call and its output came back


async def test_a_named_function_and_a_stateless_history_of_calls_and_outputs(tmp_path):
    async with serve(tmp_path) as (node, _):
        sdk = node.sdk()
        first = await sdk.responses.create(model="sim", input="Weather?", tools=TOOLS, max_output_tokens=200,
                                           tool_choice={"type": "function", "name": "get_weather"})
        call = first.output[0]
        history = [{"role": "user", "content": "Weather?"}, call.model_dump(exclude_none=True),
                   {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
        answer = await sdk.responses.create(model="sim", input=history, tools=TOOLS, max_output_tokens=5)
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert answer.status in ("completed", "incomplete") and answer.output


async def test_a_streamed_call_sends_its_arguments_in_pieces(tmp_path):
    async with serve(tmp_path) as (node, _):
        stream = await node.sdk().responses.create(model="sim", input="Weather?", tools=TOOLS, stream=True,
                                                   tool_choice="required", max_output_tokens=200)
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert kinds[-1] == "response.completed" and "response.output_text.delta" not in kinds
    assert len(deltas) > 1 and "".join(deltas) == done.arguments == events[-1].response.output[0].arguments
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_an_unknown_named_function_is_400_naming_tool_choice(tmp_path):
    async with serve(tmp_path) as (node, _):
        with pytest.raises(openai.BadRequestError) as caught:
            await node.sdk().responses.create(model="sim", input="x", tools=TOOLS,
                                              tool_choice={"type": "function", "name": "nope"})
    assert caught.value.body["param"] == "tool_choice"
