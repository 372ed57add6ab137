"""Structured output end to end with the official SDK, over the reference engine and its xgrammar masks.

The synthetic models have random weights: inside an unbounded string they can run for thousands of
tokens, so the schemas here bound every string (maxLength), number (minimum/maximum) and choice (enum), and
max_tokens leaves room for the longest output they allow. What is asserted is never weakened: the
output parses, and validates against its schema.
"""
from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from inferd.artifacts.build.reference import build_synthetic
from inferd.engine.reference.engine import ReferenceEngine

MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
# Every string bounded: a character can take 6 bytes escaped (\\uXXXX), each a token at worst.
ROOM = 256


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    mood: Literal["happy", "sad"]


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "rank"],
          "properties": {"city": {"type": "string", "maxLength": 6}, "rank": {"type": "integer", "minimum": 1,
                                                                               "maximum": 9}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="session")
def small_artifact(tmp_path_factory: pytest.TempPathFactory):
    """engines/small/<version>: the synthetic `small` model (8 layers, vocab 8192), built once."""
    return build_synthetic("small", tmp_path_factory.mktemp("engines"), progress=lambda message: None)


def reference_engine(artifact) -> ReferenceEngine:
    return ReferenceEngine(artifact, num_kv_blocks=128, block_size=16, max_batch_size=4, max_num_tokens=64)


@pytest.fixture
async def tiny(serve, tiny_artifact):
    return await serve({"tiny": reference_engine(tiny_artifact)})


async def test_sdk_parse_returns_a_parsed_pydantic_object_on_the_small_model(serve, small_artifact):
    served = await serve({"small": reference_engine(small_artifact)})
    completion = await served.sdk.chat.completions.parse(model="small", messages=MESSAGES, response_format=Person,
                                                         max_tokens=ROOM, seed=1)
    (choice,) = completion.choices
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    assert Person.model_validate_json(choice.message.content) == choice.message.parsed


async def test_a_streamed_json_schema_arrives_in_pieces_that_join_into_output_that_validates(tiny):
    async with tiny.sdk.chat.completions.stream(model="tiny", messages=MESSAGES, response_format=Person,
                                                max_tokens=ROOM, seed=2) as stream:
        pieces = [event.delta async for event in stream if event.type == "content.delta"]
        final = await stream.get_final_completion()
    (choice,) = final.choices
    assert len(pieces) > 1 and "".join(pieces) == choice.message.content
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
async def test_json_schema_output_validates_against_its_schema(tiny, seed):
    resp = await tiny.sdk.chat.completions.create(model="tiny", messages=MESSAGES, response_format=FORMAT,
                                                  max_tokens=ROOM, seed=seed)
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), SCHEMA)


async def test_the_output_keeps_the_schemas_property_order(tiny):
    reordered = {**SCHEMA, "properties": dict(reversed(list(SCHEMA["properties"].items())))}
    resp = await tiny.sdk.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=ROOM, seed=0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": reordered}})
    assert list(json.loads(resp.choices[0].message.content)) == ["rank", "city"]


async def test_a_second_request_with_the_same_schema_compiles_nothing(tiny):
    await tiny.sdk.chat.completions.create(model="tiny", messages=MESSAGES, response_format=FORMAT,
                                           max_tokens=ROOM, seed=0)
    compiles = tiny.engine.grammars.compiles
    await tiny.sdk.completions.create(model="tiny", prompt="again", max_tokens=ROOM, seed=1,
                                      extra_body={"response_format": FORMAT})
    assert tiny.engine.grammars.compiles == compiles


async def test_a_generation_cut_by_max_tokens_says_length_as_openai_does(tiny):
    resp = await tiny.sdk.chat.completions.create(model="tiny", messages=MESSAGES, response_format=FORMAT,
                                                  max_tokens=3, seed=0)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 3
    with pytest.raises(openai.LengthFinishReasonError):
        await tiny.sdk.chat.completions.parse(model="tiny", messages=MESSAGES, response_format=Person,
                                              max_tokens=3, seed=0)


@pytest.mark.parametrize(("constraint", "check"), [
    ({"choice": ["yes", "no", "maybe so"]}, lambda text: text in ("yes", "no", "maybe so")),
    ({"regex": "[a-f]{2,5}-[0-9]{3}"}, lambda text: re.fullmatch("[a-f]{2,5}-[0-9]{3}", text)),
    ({"grammar": 'root ::= "(" digit ("," digit)? ")"\ndigit ::= [0-9]'},
     lambda text: re.fullmatch(r"\([0-9](,[0-9])?\)", text)),
    ({"json": json.dumps(SCHEMA)}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
])
async def test_vllm_structured_outputs_constrain_completions_and_chat(tiny, constraint, check):
    extra = {"structured_outputs": constraint}
    text = (await tiny.sdk.completions.create(model="tiny", prompt="answer:", max_tokens=ROOM, seed=5,
                                              extra_body=extra)).choices[0].text
    chat = (await tiny.sdk.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=ROOM, seed=5,
                                                   extra_body=extra)).choices[0].message.content
    assert check(text) and check(chat), (text, chat)


async def test_n_choices_each_follow_the_grammar(tiny):
    resp = await tiny.sdk.chat.completions.create(model="tiny", messages=MESSAGES, response_format=FORMAT,
                                                  max_tokens=ROOM, seed=3, n=3)
    for choice in resp.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex", "invalid_regex"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs.grammar",
     "invalid_grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
     "response_format.json_schema.schema", "invalid_schema"),
])
async def test_what_xgrammar_refuses_is_a_400_naming_the_field_and_runs_nothing(tiny, extra, param, code):
    with pytest.raises(openai.BadRequestError) as info:
        await tiny.sdk.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, extra_body=extra)
    assert (info.value.body["param"], info.value.body["code"]) == (param, code), info.value.body
    assert tiny.engine.stats().steps_total == 0
