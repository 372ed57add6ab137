"""LangChain's tool calling against the real app, unmodified: `bind_tools` (auto and required) and
`with_structured_output(..., method="function_calling")` (a named tool_choice), streamed and not."""
from __future__ import annotations

from typing import Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from tests.api.conftest import sim_engine

langchain_openai = pytest.importorskip("langchain_openai")


class Weather(BaseModel):
    """The forecast for a city."""

    city: Literal["Paris", "Oslo", "Lima"]          # bounded: a random-weight model can run long in an open string
    days: int = Field(ge=1, le=7)


class Clock(BaseModel):
    """The time in a zone."""

    zone: Literal["UTC", "CET"]


QUESTION = "What is the weather in Paris for three days?"


@pytest.fixture
async def chat(serve):
    served = await serve({"sim": sim_engine(max_model_len=2048)})      # room for the tools' schemas
    async with httpx.AsyncClient() as http:     # ours, so its connections close with the test
        yield langchain_openai.ChatOpenAI(base_url=served.base_url + "/v1", api_key="x", model="sim", seed=1,
                                          max_retries=0, http_async_client=http)


async def test_bind_tools_with_required_returns_tool_calls_with_parsed_args(chat):
    message = await chat.bind_tools([Weather, Clock], tool_choice="required").ainvoke(QUESTION)
    assert message.tool_calls and message.response_metadata["finish_reason"] == "tool_calls"
    for call in message.tool_calls:
        model = {"Weather": Weather, "Clock": Clock}[call["name"]]
        model.model_validate(call["args"])
        assert call["id"].startswith("call_")


async def test_bind_tools_streamed_assembles_the_same_calls(chat):
    bound = chat.bind_tools([Weather], tool_choice="Weather")
    whole = None
    async for chunk in bound.astream(QUESTION):
        whole = chunk if whole is None else whole + chunk
    assert [c["name"] for c in whole.tool_calls] == ["Weather"]
    Weather.model_validate(whole.tool_calls[0]["args"])


async def test_bind_tools_auto_answers_with_text_or_calls(chat):
    message = await chat.bind_tools([Weather, Clock]).ainvoke(QUESTION, max_tokens=8)
    assert isinstance(message.content, str) and message.response_metadata["finish_reason"] in ("stop", "length")


async def test_with_structured_output_function_calling_returns_the_pydantic_object(chat):
    result = await chat.with_structured_output(Weather, method="function_calling").ainvoke(QUESTION)
    assert isinstance(result, Weather)
    raw = await chat.with_structured_output(Clock, method="function_calling", include_raw=True).ainvoke(QUESTION)
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Clock)
