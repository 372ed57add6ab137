"""Clients of the Responses API, unmodified, against the real daemon: LangChain's ChatOpenAI with
use_responses_api (invoke, stream, its answer passed back, bind_tools) and the llm CLI with `responses: true`."""
from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from inferd.store import UsageFilter
from tests.api.batch_harness import serve

KEPT = '[tenants.local]\nretention = "1h"\n'

async def test_langchain_chat_model_on_the_responses_api_invokes_streams_and_passes_its_answer_back(tmp_path):
    langchain_openai = pytest.importorskip("langchain_openai")
    async with serve(tmp_path, KEPT) as (node, _), httpx.AsyncClient() as http:
        llm = langchain_openai.ChatOpenAI(model="sim", base_url=node.url + "/v1", api_key="x", max_tokens=5,
                                          use_responses_api=True, max_retries=0, http_async_client=http)
        first = await llm.ainvoke([("system", "be brief"), ("human", "hello")])
        chunks = [chunk async for chunk in llm.astream("hello again")]
        again = await llm.ainvoke([("human", "hello"), first, ("human", "more")])    # its output passed back
    assert first.response_metadata["id"].startswith("resp_") and first.text and first.usage_metadata["output_tokens"] == 5
    assert "".join(chunk.text for chunk in chunks) and again.text


async def test_the_llm_cli_with_responses_true_answers_and_continues_a_conversation(tmp_path):
    """`llm` (simonw/llm) with `responses: true` in extra-openai-models.yaml: a prompt, then `-c`, which sends the
    conversation back as input items (its own store: false)."""
    exe = shutil.which("llm", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the llm CLI is not installed")
    async with serve(tmp_path, KEPT) as (node, _):
        (tmp_path / "extra-openai-models.yaml").write_text(
            f"- model_id: inferd\n  model_name: sim\n  api_base: {node.url}/v1\n  responses: true\n")
        env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "x"}
        outputs = []
        for args in (["-m", "inferd", "hello"], ["-c", "more please", "--no-stream"]):
            proc = await asyncio.create_subprocess_exec(exe, *args, "-o", "max_tokens", "4", env=env,
                                                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            outputs.append(out.decode().strip())
        rows = [row for _, row in await node.daemon.state.ledger.rows(UsageFilter(tenant="local"))]
    assert all(outputs) and [r.endpoint for r in rows] == ["responses", "responses"]
    assert rows[1].prompt_tokens > rows[0].prompt_tokens + 4        # the first turn came back as input


async def test_langchain_bind_tools_on_the_responses_api_calls_takes_the_tool_message_back_and_streams(tmp_path):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return "sunny"

    async with serve(tmp_path, KEPT) as (node, _), httpx.AsyncClient() as http:
        llm = langchain_openai.ChatOpenAI(model="sim", base_url=node.url + "/v1", api_key="x", max_tokens=100,
                                          use_responses_api=True, max_retries=0, http_async_client=http)
        forced = llm.bind_tools([get_weather], tool_choice="required")
        asked = await forced.ainvoke("weather in Paris?")
        call = asked.tool_calls[0]
        answer = await llm.bind_tools([get_weather]).ainvoke(
            [("human", "weather in Paris?"), asked, ToolMessage("sunny", tool_call_id=call["id"])])
        chunks = [chunk async for chunk in forced.astream("weather?")]
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    assert answer.text or answer.tool_calls
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed = streamed + chunk
    assert streamed.tool_calls and streamed.tool_calls[0]["name"] == "get_weather"
