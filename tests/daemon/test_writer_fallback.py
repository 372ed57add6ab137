"""A stream whose handover to a writer process fails is written in the daemon process instead: whole, in order,
recorded 200 and billed what it delivered, never an empty disconnect."""
from __future__ import annotations

import pytest

from inferd.api.streaming import writer_wire as wire
from inferd.api.streaming.writers import WriterDown
from tests.daemon.harness import running_daemon
from tests.daemon.test_writers import daemon_writers, usage_rows, writers_config

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "hi"}]


async def stream_and_whole(url: str) -> tuple[list, object]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        whole = await sdk.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=40, temperature=0)
        stream = await sdk.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=40, temperature=0,
                                                   stream=True, stream_options={"include_usage": True})
        return [c async for c in stream], whole


def assert_whole(chunks: list, whole) -> None:
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_a_stream_with_no_writer_left_at_its_handover_is_written_in_process(tmp_path):
    async with running_daemon(writers_config(tmp_path)) as (daemon, _, url):
        pool = daemon_writers(daemon)
        pool.pick = lambda: None                # alive when the stream was routed, gone by its handover
        chunks, whole = await stream_and_whole(url)
        rows = await usage_rows(url)
    assert (pool.handed, pool.kept) == (0, 1)
    assert_whole(chunks, whole)
    streamed = [r for r in rows if r["completion_tokens"] == whole.usage.completion_tokens]
    assert len(rows) == 2 and {r["status"] for r in rows} == {200} and len(streamed) == 2


async def test_a_writer_that_refuses_the_open_leaves_the_stream_written_in_process(tmp_path):
    async with running_daemon(writers_config(tmp_path)) as (daemon, _, url):
        pool = daemon_writers(daemon)
        [link] = pool.links
        send = link.send

        def refuse_open(message, fds=None):     # as a writer too far behind (its queue full) refuses it
            if message[0] == wire.OPEN:
                raise WriterDown("the writer process is not keeping up")
            send(message, fds)
        link.send = refuse_open
        chunks, whole = await stream_and_whole(url)
        rows = await usage_rows(url)
    assert (pool.handed, pool.kept) == (0, 1)
    assert_whole(chunks, whole)
    assert {r["status"] for r in rows} == {200}
