"""Tools on /v1/chat/completions through the real app and the official SDK: a tool loop (tool_choice
"required" makes the call, the `tool` message goes back, the model answers), streamed and not, on the sim and
on the reference engine with the synthetic model's own (Hermes) template; named functions; the output filter
sees the arguments; usage counts every token."""
from __future__ import annotations

import dataclasses
import json

import jsonschema
import openai
import pytest

from inferd.engine.reference.engine import ReferenceEngine
from tests.api.conftest import Served, sim_engine
from tests.daemon.harness import running, sim_model, write_config

# Bounded arguments (enums, a small integer range): a random-weight model can run long inside an open string.
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
         "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "clock", "description": "The time", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "clock": CLOCK}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# The tiny synthetic model's context is 512 tokens and its 512-token vocabulary spells JSON almost a character a
# token: its tools are short (the clock's schema, undescribed), the sim's are the full two.
SHORT_TOOLS = [{"type": "function", "function": {"name": "clock", "parameters": CLOCK}}]


@dataclasses.dataclass
class Api:
    served: Served
    tools: list[dict]

    @property
    def sdk(self):
        return self.served.sdk

    @property
    def engine(self):
        return self.served.engine


@pytest.fixture(params=["sim", "reference"])
async def api(request, serve, tiny_artifact) -> Api:
    if request.param == "reference":
        engine = ReferenceEngine(tiny_artifact, num_kv_blocks=128, block_size=16, max_batch_size=4,
                                 max_num_tokens=256)
        return Api(await serve({"m": engine}), SHORT_TOOLS)
    return Api(await serve({"m": sim_engine(max_model_len=2048)}), TOOLS)


def check_calls(calls, *, names=None) -> None:
    assert calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name in (names or SCHEMAS)
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


async def _streamed(sdk, **kw):
    """The SDK's own stream helper assembles the deltas into the message, as a client's code would."""
    async with sdk.chat.completions.stream(**kw, stream_options={"include_usage": True}) as stream:
        return await stream.get_final_completion()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_loop_required_call_then_tool_message_then_an_answer(api, stream):
    sdk = api.sdk
    create = (lambda **kw: _streamed(sdk, **kw)) if stream else sdk.chat.completions.create
    first = await create(model="m", messages=QUESTION, tools=api.tools, tool_choice="required",
                         seed=1, parallel_tool_calls=False)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_calls(choice.message.tool_calls)
    assert len(choice.message.tool_calls) == 1          # parallel_tool_calls false: one call
    call = choice.message.tool_calls[0]
    history = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]
    kw = dict(model="m", messages=history, tools=api.tools, max_tokens=12, seed=1)
    final = await sdk.chat.completions.create(**kw)
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length") and isinstance(answer.message.content, str)
    assert answer.message.tool_calls in (None, [])
    assert final.usage.completion_tokens >= 1 and final.usage.prompt_tokens > first.usage.prompt_tokens
    if stream:      # the SDK's helper refuses a `length` answer, so the answer's stream is read as it comes
        chunks = [c async for c in await sdk.chat.completions.create(**kw, stream=True)]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer.message.content


async def test_the_prompt_is_the_models_own_template_with_the_tools_rendered(api):
    whole = await api.sdk.chat.completions.create(model="m", messages=QUESTION, tools=api.tools, max_tokens=1)
    tok = api.engine.tokenizer
    expected = tok.encode(tok.apply_chat_template(QUESTION, add_generation_prompt=True, tools=api.tools),
                          add_special_tokens=False)
    assert whole.usage.prompt_tokens == len(expected)
    plain = await api.sdk.chat.completions.create(model="m", messages=QUESTION, max_tokens=1)
    assert plain.usage.prompt_tokens < whole.usage.prompt_tokens
    assert api.engine.info.tool_call_format == "hermes"     # the manifest's (reference), ChatML's (sim)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_named_function_is_called_with_arguments_that_fit_its_schema(api, stream):
    kw = dict(model="m", messages=QUESTION, tools=api.tools, seed=2,
              tool_choice={"type": "function", "function": {"name": "clock"}})
    whole = await (_streamed(api.sdk, **kw) if stream else api.sdk.chat.completions.create(**kw))
    assert whole.choices[0].finish_reason == "tool_calls"
    check_calls(whole.choices[0].message.tool_calls, names=["clock"])


async def test_streamed_calls_arrive_as_openai_streams_them_and_usage_counts_every_token(api):
    stream = await api.sdk.chat.completions.create(model="m", messages=QUESTION, tools=api.tools, tool_choice="required",
                                                   seed=3, stream=True,
                                                   stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name in SCHEMAS and deltas[0].type == "function"
    assert all(d.id is None and d.function.name is None for d in deltas if d.index == 0 and d is not deltas[0])
    ends = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert ends == ["tool_calls"]
    whole = await api.sdk.chat.completions.create(model="m", messages=QUESTION, tools=api.tools, tool_choice="required",
                                                  seed=3)
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens >= 1


async def test_a_call_cut_by_max_tokens_says_length(api):
    whole = await api.sdk.chat.completions.create(model="m", messages=QUESTION, tools=api.tools, tool_choice="required",
                                                  max_tokens=3)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 3


async def test_auto_without_a_call_is_plain_content(api):
    whole = await api.sdk.chat.completions.create(model="m", messages=QUESTION, tools=api.tools, max_tokens=8, seed=4)
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert isinstance(whole.choices[0].message.content, str) and not whole.choices[0].message.tool_calls


async def test_a_named_tool_that_is_not_declared_is_a_400_naming_tool_choice(served):
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.chat.completions.create(model="sim", messages=QUESTION, tools=TOOLS, max_tokens=4,
                                                 tool_choice={"type": "function", "function": {"name": "nope"}})
    assert exc.value.body["param"] == "tool_choice"


async def test_the_output_filter_sees_the_arguments(tmp_path):
    """A rule matching what only an argument can say stops the response: the call never reaches the client."""
    path = write_config(tmp_path / "c.toml", {"small": sim_model()},
                        '[tenants.local]\npolicy = "p"\n[policies.p.output]\npatterns = ["Paris|Oslo|Lima"]\n')
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    async with running(path) as (_, url):
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            whole = await sdk.chat.completions.create(model="small", messages=QUESTION, tools=tools,
                                                      tool_choice="required")
            stream = await sdk.chat.completions.create(model="small", messages=QUESTION, tools=tools,
                                                       tool_choice="required", stream=True)
            chunks = [c async for c in stream]
    assert whole.choices[0].finish_reason == "content_filter"
    for call in whole.choices[0].message.tool_calls or ():
        assert not any(city in call.function.arguments for city in ("Paris", "Oslo", "Lima"))
    sent = "".join(tc.function.arguments or "" for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ())
    assert not any(city in sent for city in ("Paris", "Oslo", "Lima"))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["content_filter"]


async def test_several_choices_each_make_their_own_calls_streamed_and_not(api):
    kw = dict(model="m", messages=QUESTION, tools=api.tools, tool_choice="required", n=2, seed=6)
    whole = await api.sdk.chat.completions.create(**kw)
    assert [c.finish_reason for c in whole.choices] == ["tool_calls", "tool_calls"]
    for choice in whole.choices:
        check_calls(choice.message.tool_calls)
    stream = await api.sdk.chat.completions.create(**kw, stream=True)
    chunks = [c async for c in stream]
    named = {(c.choices[0].index, tc.function.name) for c in chunks if c.choices
             for tc in c.choices[0].delta.tool_calls or () if tc.id}
    assert {i for i, _ in named} == {0, 1}
    assert sorted(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason) == \
        ["tool_calls", "tool_calls"]


async def test_logprobs_come_with_the_calls_one_entry_per_token(api):
    kw = dict(model="m", messages=QUESTION, tools=api.tools, tool_choice="required", seed=7, logprobs=True)
    whole = await api.sdk.chat.completions.create(**kw)
    assert len(whole.choices[0].logprobs.content) == whole.usage.completion_tokens
    stream = await api.sdk.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == chunks[-1].usage.completion_tokens


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
async def test_a_client_leaving_in_the_middle_of_a_streamed_call_frees_its_kv_blocks(serve, path):
    served = await serve({"m": sim_engine(max_model_len=2048, time_scale=2.0)})
    idle = await served.free_kv_blocks()
    call = {"regex": '<tool_call>\\{"name": "clock", "arguments": \\{"zone": "a{400}'}    # a long call, paced
    body = {"model": "m", "stream": True, "tool_choice": "auto"}
    if path == "/v1/responses":
        body |= {"input": "hi", "max_output_tokens": 500, "text": None,
                 "tools": [{"type": "function", "name": "clock", "parameters": CLOCK}]}
    else:
        body |= {"messages": QUESTION, "max_tokens": 500, "tools": TOOLS, "structured_outputs": call}
    body = {k: v for k, v in body.items() if v is not None}
    resp = await served.http.post(served.base_url + path, json=body)
    await resp.content.readuntil(b"\n\n")           # generation is under way
    assert await served.free_kv_blocks() < idle
    resp.close()                                    # drop the connection mid-stream
    assert await served.state.wait_idle(timeout=1.0)
    assert await served.free_kv_blocks() == idle
    assert served.engine.stats().running == 0
