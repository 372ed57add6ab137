"""Structured output from the clients people use, unmodified, against the real app over the reference engine:
LangChain's `with_structured_output` (json_schema and json_mode) and Simon Willison's `llm --schema`
(registered as an OpenAI-compatible model in its extra-openai-models.yaml, run as a subprocess).

The synthetic `tiny` model has random weights, so every schema bounds its strings, numbers and choices,
and a fixed seed picks the sample; what is asserted is that the output parses and validates.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from inferd.engine.reference.engine import ReferenceEngine

ROOM = 256          # max_tokens: more than the longest output the schemas below allow
LLM_CLI = Path(sys.executable).with_name("llm")
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "rank"],
          "properties": {"city": {"type": "string", "maxLength": 6},
                         "rank": {"type": "integer", "minimum": 1, "maximum": 9}}}


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    mood: Literal["happy", "sad"]


@pytest.fixture
async def tiny(serve, tiny_artifact):
    engine = ReferenceEngine(tiny_artifact, num_kv_blocks=128, block_size=16, max_batch_size=4, max_num_tokens=64)
    return await serve({"tiny": engine})


def chat_model(served, http: httpx.AsyncClient, **kwargs):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(base_url=served.base_url + "/v1", api_key="x", model="tiny", max_tokens=ROOM,
                                       max_retries=0, http_async_client=http, **kwargs)


async def test_langchain_with_structured_output_json_schema_returns_the_pydantic_object(tiny):
    async with httpx.AsyncClient() as http:     # ours, so its connections close with the test
        structured = chat_model(tiny, http, seed=1).with_structured_output(Person, method="json_schema")
        person = await structured.ainvoke("Describe a person.")
    assert isinstance(person, Person)


async def test_langchain_with_structured_output_json_schema_from_a_dict_schema(tiny):
    async with httpx.AsyncClient() as http:
        schema = {**SCHEMA, "title": "place", "description": "A place."}
        structured = chat_model(tiny, http, seed=2).with_structured_output(schema, method="json_schema")
        place = await structured.ainvoke("Name a place.")
    jsonschema.validate(place, SCHEMA)


async def test_langchain_json_mode_returns_a_parsed_json_object(tiny):
    async with httpx.AsyncClient() as http:
        structured = chat_model(tiny, http, seed=1).with_structured_output(
            SCHEMA, method="json_mode", include_raw=True)
        result = await structured.ainvoke("Answer in JSON.")
    assert result["parsing_error"] is None
    assert result["raw"].response_metadata["finish_reason"] == "stop"
    assert isinstance(result["parsed"], dict) and result["parsed"] == json.loads(result["raw"].content)


async def run_llm(served, tmp_path: Path, *args: str) -> str:
    """`llm` with the daemon registered as model `inferd-tiny`; its stdout (a failure shows its output)."""
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: inferd-tiny\n  model_name: tiny\n  api_base: \"{served.base_url}/v1\"\n"
        "  supports_schema: true\n")
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "x",
           "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    proc = await asyncio.create_subprocess_exec(
        str(LLM_CLI), "-m", "inferd-tiny", "--no-log", *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")
    return out.decode()


async def test_llm_schema_prints_json_that_validates(tiny, tmp_path):
    out = await run_llm(tiny, tmp_path, "--schema", json.dumps(SCHEMA), "-o", "max_tokens", str(ROOM),
                        "-o", "seed", "3", "Name a place.")
    jsonschema.validate(json.loads(out), SCHEMA)


async def test_llm_json_object_option_prints_a_json_object(tiny, tmp_path):
    out = await run_llm(tiny, tmp_path, "-o", "json_object", "1", "-o", "max_tokens", str(ROOM),
                        "-o", "seed", "1", "Answer in JSON.")
    assert isinstance(json.loads(out), dict)
