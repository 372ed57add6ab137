"""POST /v1/responses through the real daemon with the official SDK: the Response object and its typed
events, stored per tenant under its retention, continued by previous_response_id, with chat's ledger,
idempotency and errors naming the Responses API's own fields."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import orjson
import pydantic
import pytest

from inferd.store import StoreError, UsageFilter
from inferd.types import Delta, FinishReason
from tests.api.batch_harness import serve
from tests.daemon.harness import running, sim_model, write_config

KEPT = '[tenants.local]\nretention = "1h"\n'
TENANTS = '[tenants.a]\nretention = "1h"\n[tenants.b]\nretention = "1h"\n'
EVENTS_IN_ORDER = ["response.created", "response.in_progress", "response.output_item.added",
                   "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


async def test_a_response_has_its_output_usage_and_a_length_cut_says_incomplete(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _):
        r = await node.sdk().responses.create(model="sim", input="hello there", instructions="be brief",
                                              max_output_tokens=4, metadata={"k": "v"})
    assert r.object == "response" and r.id.startswith("resp_") and r.model.startswith("sim@")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "message" and r.output[0].role == "assistant" and r.output_text
    assert r.usage.output_tokens == 4 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == "be brief" and r.max_output_tokens == 4 and r.metadata == {"k": "v"} and r.store


async def test_a_stream_sends_the_typed_events_in_order_and_its_deltas_make_the_output(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _):
        stream = await node.sdk().responses.create(model="sim", input="hello", max_output_tokens=6, stream=True)
        events = [event async for event in stream]
        stored = await node.sdk().responses.retrieve(events[-1].response.id)
    kinds = [e.type for e in events]
    assert kinds[:4] == EVENTS_IN_ORDER and kinds[-4:] == CLOSING + ["response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-4].text == text == events[-1].response.output_text == stored.output_text
    assert events[-1].response.usage.output_tokens == 6


async def test_a_stream_ends_with_its_closing_event_and_no_done_sentinel(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _), aiohttp.ClientSession() as http:
        async with http.post(node.url + "/v1/responses", json={"model": "sim", "input": "hi", "stream": True}) as resp:
            body = await resp.text()
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    frames = [f for f in body.split("\n\n") if f.startswith("event: ")]
    assert frames[-1].startswith("event: response.completed\n") or frames[-1].startswith("event: response.incomplete")
    assert "[DONE]" not in body


async def test_previous_response_id_puts_the_stored_conversation_before_the_input(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _):
        sdk = node.sdk()
        first = await sdk.responses.create(model="sim", input="hello there", max_output_tokens=5)
        again = await sdk.responses.create(model="sim", input="and more", max_output_tokens=5)
        follow = await sdk.responses.create(model="sim", input="and more", max_output_tokens=5,
                                            previous_response_id=first.id, stream=True)
        events = [e async for e in follow]
    done = events[-1].response
    assert done.previous_response_id == first.id
    # the first turn's input and output come before this input (templating adds a little more)
    assert done.usage.input_tokens >= again.usage.input_tokens + first.usage.input_tokens - 3 + 5


async def test_an_unknown_previous_response_id_is_404_naming_it(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _):
        with pytest.raises(openai.NotFoundError) as caught:
            await node.sdk().responses.create(model="sim", input="x", previous_response_id="resp_00000000")
    assert caught.value.body["param"] == "previous_response_id"


async def test_another_tenants_response_cannot_be_read_deleted_or_continued(tmp_path):
    async with serve(tmp_path, TENANTS, keys_for=("a", "b")) as (node, (key_a, key_b)):
        a, b = node.sdk(key_a), node.sdk(key_b)
        made = await a.responses.create(model="sim", input="mine", max_output_tokens=3)
        for call in (b.responses.retrieve(made.id), b.responses.delete(made.id),
                     b.responses.create(model="sim", input="x", previous_response_id=made.id)):
            with pytest.raises(openai.NotFoundError):
                await call
        assert (await a.responses.retrieve(made.id)).output_text == made.output_text


async def test_a_deleted_response_is_gone(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _), aiohttp.ClientSession() as http:
        made = await node.sdk().responses.create(model="sim", input="x", max_output_tokens=3)
        async with http.delete(f"{node.url}/v1/responses/{made.id}") as resp:
            assert await resp.json() == {"id": made.id, "object": "response", "deleted": True}
        with pytest.raises(openai.NotFoundError):
            await node.sdk().responses.retrieve(made.id)


async def test_a_tenant_whose_retention_keeps_no_text_stores_nothing_and_store_true_is_400(tmp_path):
    async with serve(tmp_path) as (node, _):
        made = await node.sdk().responses.create(model="sim", input="x", max_output_tokens=3)
        assert made.store is False
        with pytest.raises(openai.NotFoundError):
            await node.sdk().responses.retrieve(made.id)
        with pytest.raises(openai.BadRequestError) as caught:
            await node.sdk().responses.create(model="sim", input="x", store=True)
    assert caught.value.body["param"] == "store"


async def test_a_tenant_set_back_to_retention_none_has_its_stored_responses_hidden_at_once(tmp_path):
    config = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)}, KEPT)
    async with running(config) as (daemon, url), openai.AsyncOpenAI(base_url=url + "/v1", api_key="x",
                                                                    max_retries=0) as sdk:
        made = await sdk.responses.create(model="sim", input="x", max_output_tokens=3)
        config.write_text(config.read_text().replace('retention = "1h"', 'retention = "none"'))
        assert (await daemon.reload()).ok
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.create(model="sim", input="y", previous_response_id=made.id)


async def test_store_false_is_not_kept_even_with_retention(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _):
        made = await node.sdk().responses.create(model="sim", input="x", max_output_tokens=3, store=False)
        with pytest.raises(openai.NotFoundError):
            await node.sdk().responses.retrieve(made.id)


async def test_the_ledger_and_the_tenants_request_count_record_it_under_the_responses_endpoint(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _), aiohttp.ClientSession() as http:
        made = await node.sdk().responses.create(model="sim", input="x", max_output_tokens=3)
        rows = [row for _, row in await node.daemon.state.ledger.rows(UsageFilter(tenant="local"))]
        async with http.get(node.url + "/metrics") as resp:
            metrics = await resp.text()
    assert [(r.endpoint, r.completion_tokens, r.status) for r in rows] == [("responses", 3, 200)]
    assert rows[0].prompt_tokens == made.usage.input_tokens
    assert 'inferd_tenant_requests_total{status="200",tenant="local"} 1.0' in metrics


SAFETY = """
[tenants.local]
retention = "1h"
policy = "p"
[policies.p.input]
words = ["forbidden phrase"]
[policies.p.output]
patterns = ["."]
"""


async def test_the_tenants_content_policy_refuses_input_naming_it_and_an_output_stop_says_content_filter(tmp_path):
    async with serve(tmp_path, SAFETY) as (node, _):
        with pytest.raises(openai.BadRequestError) as caught:
            await node.sdk().responses.create(model="sim", input="a forbidden phrase")
        stopped = await node.sdk().responses.create(model="sim", input="hello", max_output_tokens=5)
    assert (caught.value.body["code"], caught.value.body["param"]) == ("content_filter", "input")
    assert stopped.status == "incomplete" and stopped.incomplete_details.reason == "content_filter"
    assert stopped.output_text == ""


class Person(pydantic.BaseModel):
    name: str
    age: int


async def test_text_format_json_schema_constrains_the_output_so_responses_parse_returns_the_object(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _):
        parsed = await node.sdk().responses.parse(model="sim", input="a person", text_format=Person,
                                                  max_output_tokens=200)
        stream = await node.sdk().responses.create(model="sim", input="json", max_output_tokens=200, stream=True,
                                                   text={"format": {"type": "json_object"}})
        last = [event async for event in stream][-1].response
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Person)
    assert parsed.text.format.type == "json_schema" and parsed.text.format.name == "Person"
    assert last.status == "completed" and isinstance(json.loads(last.output_text), dict)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_idempotency_key_replays_the_same_response(tmp_path, stream):
    body = {"model": "sim", "input": "x", "max_output_tokens": 3, "stream": stream}
    headers = {"Idempotency-Key": "k1"}
    async with serve(tmp_path, KEPT) as (node, _), aiohttp.ClientSession() as http:
        answers = []
        for _ in range(2):
            async with http.post(node.url + "/v1/responses", json=body, headers=headers) as resp:
                answers.append((resp.headers.get("Idempotent-Replayed"), await resp.read()))
    assert answers[0][0] is None and answers[1][0] == "true" and answers[0][1] == answers[1][1]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "max_output_tokens": 100_000}, "max_output_tokens"),
    ({"input": "x", "max_tokens": 3}, "max_tokens"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0].content[0]"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "no-such-type"}}}},
     "text.format"),        # xgrammar refuses it: the grammar stage names the field that asked
])
async def test_errors_name_the_responses_api_fields(tmp_path, body, param):
    async with serve(tmp_path, KEPT) as (node, _), aiohttp.ClientSession() as http:
        async with http.post(node.url + "/v1/responses", json={"model": "sim", **body}) as resp:
            answer = json.loads(await resp.read())
    assert resp.status == 400 and answer["error"]["param"] == param, answer


# -- across a restart of a real `inferd serve` process ------------------------------------------------

SERVE_CONFIG = """[server]
port = 0
state_dir = "{state}"
drain_grace_s = 5.0
[models.sim]
backend = "sim"
max_batch_size = 4
max_num_tokens = 64
num_kv_blocks = 64
[models.sim.sim]
profile = "tiny"
time_scale = 0.0
max_model_len = 512
[tenants.local]
retention = "1h"
"""


async def _logged(proc: asyncio.subprocess.Process, event: str) -> dict:
    """The daemon's first JSON log line with `event` (it logs `listening` once it serves)."""
    while True:
        raw = await proc.stderr.readline()
        if not raw:
            pytest.fail(f"inferd serve exited before logging {event!r}")
        with contextlib.suppress(ValueError):
            line = orjson.loads(raw)
            if line.get("event") == event:
                return line


@contextlib.asynccontextmanager
async def inferd_serve(config: Path) -> AsyncIterator[str]:
    """`inferd serve --config` as a process, its URL once it serves; SIGTERM and its exit afterwards."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "inferd", "serve", "--config", str(config),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        listening = await asyncio.wait_for(_logged(proc, "listening"), 60)
        yield f"http://127.0.0.1:{listening['port']}"
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(_logged(proc, "stopped"), 30)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_previous_response_id_continues_a_conversation_after_the_daemon_restarts(tmp_path):
    config = tmp_path / "inferd.toml"
    config.write_text(SERVE_CONFIG.format(state=tmp_path / "state"))
    async with inferd_serve(config) as url, openai.AsyncOpenAI(base_url=url + "/v1", api_key="x",
                                                               max_retries=0) as sdk:
        first = await sdk.responses.create(model="sim", input="remember this", max_output_tokens=4)
    async with inferd_serve(config) as url, openai.AsyncOpenAI(base_url=url + "/v1", api_key="x",
                                                               max_retries=0) as sdk:
        assert (await sdk.responses.retrieve(first.id)).output_text == first.output_text
        stream = await sdk.responses.create(model="sim", input="go on", max_output_tokens=4,
                                            previous_response_id=first.id, stream=True)
        last = [event async for event in stream][-1].response
        alone = await sdk.responses.create(model="sim", input="go on", max_output_tokens=4, store=False)
    assert last.previous_response_id == first.id and last.output_text
    assert last.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens


def _failing(engine) -> None:
    """Every request the engine accepts ends as an engine reports a failure: FinishReason.ERROR."""
    submit = engine.submit

    def failing(request):
        stream = submit(request)
        asyncio.get_running_loop().call_soon(
            stream.push, Delta(token_ids=[], finish_reason=FinishReason.ERROR, error="injected failure"))
        return stream
    engine.submit = failing


async def test_a_streamed_abnormal_end_is_error_then_failed_with_openais_code_and_logs_no_traceback(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    async with serve(tmp_path, KEPT) as (node, _):
        _failing(next(iter(node.daemon.state.engines.values())))
        events = [e async for e in await node.sdk().responses.create(model="sim", input="hi", stream=True,
                                                                       max_output_tokens=50)]
        rows = [row for _, row in await node.daemon.state.ledger.rows(UsageFilter(tenant="local"))]
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "engine_error" and events[-1].response.error.code == "server_error"
    assert [row.status for row in rows] == [500]
    assert not [r for r in caplog.records if r.getMessage() == "stream_failed" or r.exc_info]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_store_that_fails_to_keep_the_response_is_a_503_and_the_ledger_says_503(tmp_path, stream):
    async with serve(tmp_path, KEPT) as (node, _):
        async def broken(record) -> None:
            raise StoreError("disk full")
        node.daemon.state.storage.responses.put = broken
        sdk = node.sdk()
        if stream:
            events = [e async for e in await sdk.responses.create(model="sim", input="hi", stream=True,
                                                                   max_output_tokens=3)]
            assert events[-1].type == "response.failed" and events[-2].code == "store_unavailable"
        else:
            with pytest.raises(openai.APIStatusError) as exc:
                await sdk.responses.create(model="sim", input="hi", max_output_tokens=3)
            assert exc.value.status_code == 503
        rows = [row for _, row in await node.daemon.state.ledger.rows(UsageFilter(tenant="local"))]
    assert [row.status for row in rows] == [503]


async def test_a_tenant_that_keeps_nothing_is_told_why_previous_response_id_is_not_found(tmp_path):
    async with serve(tmp_path) as (node, _):
        with pytest.raises(openai.NotFoundError) as caught:
            await node.sdk().responses.create(model="sim", input="x", previous_response_id="resp_00000000")
    assert caught.value.body["param"] == "previous_response_id"
    assert "retention is none" in caught.value.body["message"] and "docs/privacy.md" in caught.value.body["message"]


async def test_a_stored_row_keeps_only_its_own_turn_and_a_deleted_link_breaks_the_chain(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _), aiohttp.ClientSession() as http:
        sdk, store = node.sdk(), node.daemon.state.storage.responses
        first = await sdk.responses.create(model="sim", input="zebra secret", max_output_tokens=3)
        second = await sdk.responses.create(model="sim", input="walrus", max_output_tokens=3,
                                            previous_response_id=first.id)
        third = await sdk.responses.create(model="sim", input="otter", max_output_tokens=3,
                                           previous_response_id=second.id)
        row = await store.get("local", second.id, 0.0)
        assert "walrus" in row.conversation and "zebra secret" not in row.conversation
        assert third.usage.input_tokens > second.usage.input_tokens > first.usage.input_tokens   # whole chain
        async with http.delete(f"{node.url}/v1/responses/{first.id}") as resp:
            assert resp.status == 200
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.responses.create(model="sim", input="more", previous_response_id=third.id)
    assert caught.value.body["param"] == "previous_response_id" and first.id in caught.value.body["message"]


async def test_previous_response_id_is_read_after_idempotency_within_the_deadline(tmp_path):
    async with serve(tmp_path, KEPT) as (node, _):
        sdk = node.sdk()
        first = await sdk.responses.create(model="sim", input="x", max_output_tokens=3)

        async def hangs(tenant, response_id, now):
            await asyncio.Event().wait()
        node.daemon.state.storage.responses.get = hangs
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk.responses.create(model="sim", input="y", previous_response_id=first.id,
                                       extra_headers={"X-Request-Timeout": "0.2"})
    assert caught.value.status_code == 504 and caught.value.body["param"] == "previous_response_id"
