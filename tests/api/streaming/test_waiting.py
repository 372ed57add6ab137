"""inferd.api.streaming.waiting: a streamed request kept waiting in admission gets its headers and pings."""
from __future__ import annotations

import asyncio
import json

from inferd.config.tenants import AdmissionConfig
from tests.api.conftest import sim_engine


async def hold_the_only_slot(served, max_tokens: int = 400) -> asyncio.Task:
    """A stream that occupies the engine's one sequence slot (~1 s at the tiny profile's real time)."""
    started = asyncio.Event()

    async def run() -> None:
        stream = await served.sdk.completions.create(model="sim", prompt="hold", max_tokens=max_tokens, stream=True)
        async for _ in stream:
            started.set()

    task = asyncio.ensure_future(run())
    await asyncio.wait_for(started.wait(), 10.0)
    return task


async def events(resp) -> list[bytes]:
    """The SSE lines of a response, as they arrive, until the stream ends."""
    lines = []
    async for raw in resp.content:
        if raw.strip():
            lines.append(raw.strip())
    return lines


async def test_a_queued_stream_gets_its_headers_and_pings_before_its_turn_then_its_tokens(serve):
    served = await serve({"sim": sim_engine(max_batch_size=1, time_scale=1.0)}, heartbeat_interval_s=0.1)
    holder = await hold_the_only_slot(served)
    body = {"model": "sim", "prompt": "queued", "max_tokens": 5, "stream": True}
    async with served.http.post(served.base_url + "/v1/completions", json=body) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        assert not holder.done()                  # the headers came while it still waited for the slot
        lines = await events(resp)
    first_data = next(i for i, line in enumerate(lines) if line.startswith(b"data: "))
    assert b": ping" in lines[:first_data]        # kept alive while queued
    assert lines[-1] == b"data: [DONE]"
    finals = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"
    await holder


async def test_a_stream_refused_after_its_headers_went_out_ends_with_an_error_frame(serve):
    served = await serve({"sim": sim_engine(max_batch_size=1, time_scale=1.0)}, heartbeat_interval_s=0.1,
                         admission=AdmissionConfig(early_refusal=False))
    holder = await hold_the_only_slot(served)
    body = {"model": "sim", "prompt": "queued", "max_tokens": 5, "stream": True}
    async with served.http.post(served.base_url + "/v1/completions", json=body,
                                headers={"X-Request-Timeout": "0.4"}) as resp:
        assert resp.status == 200                 # headers sent at 0.1 s; the deadline passes at 0.4 s
        lines = await events(resp)
    assert lines[-1] == b"data: [DONE]"
    error = json.loads(lines[-2][6:])
    assert error["choices"] == [] and error["error"]["code"] == "deadline"
    assert served.state.tenancy.quota.snapshot()["local"]["in_flight"] == 1   # only the holder
    await holder


async def test_a_stream_admitted_at_once_is_answered_as_before_without_pings(served):
    body = {"model": "sim", "prompt": "now", "max_tokens": 3, "stream": True}
    async with served.http.post(served.base_url + "/v1/completions", json=body) as resp:
        lines = await events(resp)
    pings = [line for line in lines if line.startswith(b":") and not line.startswith(b": server-timing ")]
    assert pings == [] and lines[-1] == b"data: [DONE]"


async def test_a_client_that_leaves_while_queued_is_withdrawn_from_admission(serve):
    served = await serve({"sim": sim_engine(max_batch_size=1, time_scale=2.0)}, heartbeat_interval_s=0.05)
    holder = await hold_the_only_slot(served)     # ~2 s
    queue = next(q for _, _, q in served.state.tenancy.queues())
    body = {"model": "sim", "prompt": "queued", "max_tokens": 5, "stream": True}
    resp = await served.http.post(served.base_url + "/v1/completions", json=body)
    assert resp.status == 200 and queue.snapshot()["queued"] == 1
    resp.close()                                  # the client hangs up before its turn
    await asyncio.wait_for(left(queue), 5.0)      # the next ping fails: the request leaves the queue
    assert not holder.done()                      # withdrawn while waiting, not served later
    await holder
    assert queue.snapshot()["queued"] == 0


async def left(queue) -> None:
    while queue.snapshot()["queued"]:
        await asyncio.sleep(0.01)
