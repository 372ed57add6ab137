"""inferd.api.routes.batches and inferd.jobs.batch_runner through the real daemon, with the official SDK: batches
run to completion through the daemon's own listener, are cancelled, expire, fail, resume after their
runner stops mid-batch without running a recorded line twice, and stay within their tenant."""
from __future__ import annotations

import asyncio
import json
import time

import jsonschema
import openai
import pytest

from inferd.store import BatchStore
from tests.api.batch_harness import Runs, chat_line, jsonl, serve

DAY = 86_400


def output_lines(text: bytes) -> list[dict]:
    return [json.loads(line) for line in text.decode().splitlines()]


async def upload(client, *lines: dict) -> str:
    return (await client.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")).id


async def test_a_batch_runs_every_line_once_and_writes_output_and_error_files_in_line_order(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        too_long = chat_line("too-long", max_tokens=100_000)         # valid JSON; the model's context refuses it
        file_id = await upload(client, *(chat_line(f"req-{i}", f"hello {i}") for i in range(5)), too_long)
        batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h", metadata={"job": "nightly"})
        assert batch.status == "validating" and batch.request_counts.total == 6 and batch.metadata == {"job": "nightly"}
        assert batch.expires_at == batch.created_at + DAY
        runs = Runs()
        async with node.runner(runs, concurrency=3):
            assert await runs.end_of(batch.id) == "completed"
        done = await client.batches.retrieve(batch.id)
        assert done.status == "completed" and done.in_progress_at and done.finalizing_at and done.completed_at
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 5, 1)
        out = output_lines((await client.files.content(done.output_file_id)).content)
        assert [line["custom_id"] for line in out] == [f"req-{i}" for i in range(5)]
        for line in out:
            assert line["id"].startswith("batch_req_") and line["error"] is None
            response = line["response"]
            assert response["status_code"] == 200 and response["request_id"]
            assert response["body"]["object"] == "chat.completion"
            assert response["body"]["usage"]["completion_tokens"] == 3
        [err] = output_lines((await client.files.content(done.error_file_id)).content)
        assert err["custom_id"] == "too-long" and err["response"]["status_code"] == 400
        assert err["error"]["code"] == "context_length_exceeded"
        assert (await client.files.retrieve(done.output_file_id)).purpose == "batch_output"
        rows = await node.batch_ledger_rows("local")        # the refused line never ran: no row
        assert len(rows) == 5 and {(r.endpoint, r.status) for r in rows} == {("batch:chat.completions", 200)}


async def test_a_batch_line_with_n_gets_n_choices_as_the_route_answers(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        with pytest.raises(openai.BadRequestError, match="line 2: body.n"):     # lines are checked at upload
            await upload(client, chat_line("n-3", n=3), chat_line("n-17", n=17))
        file_id = await upload(client, chat_line("n-3", n=3, seed=5))
        batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        runs = Runs()
        async with node.runner(runs, concurrency=2):
            assert await runs.end_of(batch.id) == "completed"
        done = await client.batches.retrieve(batch.id)
        [line] = output_lines((await client.files.content(done.output_file_id)).content)
        body = line["response"]["body"]
        assert [c["index"] for c in body["choices"]] == [0, 1, 2] and body["usage"]["completion_tokens"] == 9


async def test_a_batch_line_with_structured_output_follows_its_grammar_and_a_refused_one_fails_alone(tmp_path):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        with pytest.raises(openai.BadRequestError, match="line 1: body.response_format.json_schema.name"):
            await upload(client, chat_line("no-name", response_format={"type": "json_schema", "json_schema": {}}))
        file_id = await upload(
            client, chat_line("choice", max_tokens=16, structured_outputs={"choice": ["red", "green"]}),
            chat_line("schema", max_tokens=64, response_format={"type": "json_schema",
                                                                "json_schema": {"name": "ok", "schema": schema}}),
            chat_line("bad-regex", structured_outputs={"regex": "(unclosed"}))
        batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        runs = Runs()
        async with node.runner(runs, concurrency=2):
            assert await runs.end_of(batch.id) == "completed"
        done = await client.batches.retrieve(batch.id)
        out = {line["custom_id"]: line["response"]["body"]
               for line in output_lines((await client.files.content(done.output_file_id)).content)}
        [err] = output_lines((await client.files.content(done.error_file_id)).content)
    assert out["choice"]["choices"][0]["message"]["content"] in ("red", "green")
    jsonschema.validate(json.loads(out["schema"]["choices"][0]["message"]["content"]), schema)
    assert err["custom_id"] == "bad-regex" and err["response"]["status_code"] == 400
    assert (err["error"]["code"], err["response"]["body"]["error"]["param"]) == ("invalid_regex",
                                                                                 "structured_outputs.regex")


async def test_creating_a_batch_checks_its_file_endpoint_and_window(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        file_id = await upload(client, chat_line("a"))
        with pytest.raises(openai.BadRequestError) as caught:
            await client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
        assert "line 1" in caught.value.message and caught.value.body["param"] == "endpoint"
        with pytest.raises(openai.NotFoundError) as caught:
            await client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                                        completion_window="24h")
        assert caught.value.body["param"] == "input_file_id"
        with pytest.raises(openai.BadRequestError) as caught:
            await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="1h")
        assert caught.value.body["param"] == "completion_window"
        with pytest.raises(openai.BadRequestError) as caught:
            await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h", metadata={f"k{i}": "v" for i in range(17)})
        assert caught.value.body["param"] == "metadata"


async def test_batches_list_newest_first_in_pages(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        file_id = await upload(client, chat_line("a"))
        made = [await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h") for _ in range(3)]
        first = await client.batches.list(limit=2)
        assert [b.id for b in first.data] == [made[2].id, made[1].id] and first.has_more
        every = [b.id async for b in await client.batches.list(limit=2)]     # the SDK follows `after`
        assert every == [b.id for b in reversed(made)]


async def test_another_tenant_gets_404_for_batches_and_files_it_does_not_own(tmp_path):
    async with serve(tmp_path, keys_for=("acme", "globex")) as (node, (acme_key, globex_key)):
        acme, globex = node.sdk(acme_key), node.sdk(globex_key)
        file_id = await upload(acme, chat_line("a"))
        with pytest.raises(openai.NotFoundError):
            await globex.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
        batch = await acme.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                          completion_window="24h")
        for call in (globex.batches.retrieve, globex.batches.cancel):
            with pytest.raises(openai.NotFoundError):
                await call(batch.id)
        assert (await globex.batches.list()).data == []
        runs = Runs()
        async with node.runner(runs):
            assert await runs.end_of(batch.id) == "completed"
        done = await acme.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            await globex.files.content(done.output_file_id)
        assert len(await node.batch_ledger_rows("acme")) == 1 and await node.batch_ledger_rows("globex") == []


async def test_cancel_stops_starting_lines_and_ends_cancelled_with_the_lines_done(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        file_id = await upload(client, *(chat_line(f"req-{i}") for i in range(6)))
        before = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                             completion_window="24h")
        assert (await client.batches.cancel(before.id)).status == "cancelling"      # no runner yet
        running = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                              completion_window="24h")
        runs, held, release = Runs(), asyncio.Event(), asyncio.Event()

        async def gate(batch_id, result) -> None:     # hold the only worker after the 2nd line of `running`
            if batch_id == running.id and sum(b == running.id for b, _ in runs.results) == 2:
                held.set()
                await release.wait()

        runs.gate = gate
        async with node.runner(runs, concurrency=1):
            assert await runs.end_of(before.id) == "cancelled"
            await asyncio.wait_for(held.wait(), 10)
            assert (await client.batches.cancel(running.id)).status == "cancelling"
            release.set()
            assert await runs.end_of(running.id) == "cancelled"
        none = await client.batches.retrieve(before.id)
        assert none.status == "cancelled" and none.output_file_id is None and none.request_counts.completed == 0
        done = await client.batches.retrieve(running.id)
        assert done.status == "cancelled" and done.cancelling_at and done.cancelled_at
        assert done.request_counts.completed == 2
        out = output_lines((await client.files.content(done.output_file_id)).content)
        assert [line["custom_id"] for line in out] == ["req-0", "req-1"]
        with pytest.raises(openai.ConflictError):       # a batch that ended cannot be cancelled
            await _cancel_ended(client, node, file_id)


async def _cancel_ended(client, node, file_id: str) -> None:
    batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    runs = Runs()
    async with node.runner(runs):
        await runs.end_of(batch.id)
    await client.batches.cancel(batch.id)           # completed: 409


async def test_a_batch_resumes_after_its_runner_stops_without_running_recorded_lines_again(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        file_id = await upload(client, *(chat_line(f"req-{i}") for i in range(8)))
        batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        first, stuck = Runs(), asyncio.Event()

        async def hang_after_three(batch_id, result) -> None:     # the worker stops here, nothing in flight
            if len(first.results) == 3:
                stuck.set()
                await asyncio.Event().wait()

        first.gate = hang_after_three
        async with node.runner(first, concurrency=1, owner="node-a"):
            await asyncio.wait_for(stuck.wait(), 10)
        # node-a is gone (its lease released on close; a killed one's lapses after lease_s, tests/store)
        assert (await client.batches.retrieve(batch.id)).request_counts.completed == 3
        second = Runs()
        async with node.runner(second, concurrency=4, owner="node-b"):
            assert await second.end_of(batch.id) == "completed"
        assert sorted(r.idx for _, r in second.results) == [3, 4, 5, 6, 7]
        done = await client.batches.retrieve(batch.id)
        out = output_lines((await client.files.content(done.output_file_id)).content)
        assert [line["custom_id"] for line in out] == [f"req-{i}" for i in range(8)]
        assert len(await node.batch_ledger_rows("local")) == 8         # every line ran exactly once


async def test_a_batch_past_its_window_expires_with_its_lines_as_errors(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        file_id = await upload(client, chat_line("a"), chat_line("b"))
        batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        runs = Runs()
        async with node.runner(runs, clock=lambda: time.time() + 2 * DAY):
            assert await runs.end_of(batch.id) == "expired"
        done = await client.batches.retrieve(batch.id)
        assert done.status == "expired" and done.expired_at and done.output_file_id is None
        errors = output_lines((await client.files.content(done.error_file_id)).content)
        assert [(e["custom_id"], e["error"]["code"], e["response"]) for e in errors] == [
            ("a", "batch_expired", None), ("b", "batch_expired", None)]
        assert await node.batch_ledger_rows("local") == []


async def test_a_batch_whose_input_was_deleted_fails_naming_it(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        file_id = await upload(client, chat_line("a"))
        batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        await client.files.delete(file_id)
        runs = Runs()
        async with node.runner(runs):
            assert await runs.end_of(batch.id) == "failed"
        done = await client.batches.retrieve(batch.id)
        assert done.status == "failed" and done.failed_at
        [error] = done.errors.data
        assert error.code == "input_file_not_found" and file_id in error.message


async def test_two_runners_share_the_batches_and_each_runs_each_line_once(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        file_id = await upload(client, *(chat_line(f"req-{i}") for i in range(4)))
        batches = [await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                               completion_window="24h") for _ in range(3)]
        runs = Runs()
        async with node.runner(runs, owner="a"), node.runner(runs, owner="b"):
            await runs.until(lambda: len(runs.ended) == 3)
        assert set(runs.ended.values()) == {"completed"}
        assert sorted((b, r.idx) for b, r in runs.results) == sorted((b.id, i) for b in batches for i in range(4))
        store = BatchStore(node.daemon.state.store)
        assert {(await store.load(b.id)).completed for b in batches} == {4}
