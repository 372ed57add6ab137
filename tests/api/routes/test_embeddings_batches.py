"""Embeddings as Batch API lines: checked when the batch is created, run in the batch class, written to the
output file as /v1/embeddings would answer them, and billed as `batch:embeddings`."""
from __future__ import annotations

import json

import openai
import pytest

from tests.api.batch_harness import Runs, jsonl, serve

EMBED = '[models.emb]\nbackend = "sim"\ntask = "embed"\n[models.emb.sim]\nprofile = "tiny"\ntime_scale = 0.0\n' \
        'max_model_len = 64\n'


def embed_line(custom_id: str, inputs, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "emb", "input": inputs, **body}}


async def test_a_batch_of_embedding_lines_runs_and_bills_each_line(tmp_path):
    async with serve(tmp_path, EMBED) as (node, _):
        client = node.sdk()
        upload = await client.files.create(file=("in.jsonl", jsonl(
            embed_line("one", "a text"), embed_line("two", ["two", "texts"], dimensions=64),
            embed_line("long", "word " * 400))), purpose="batch")
        batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                            completion_window="24h")
        runs = Runs()
        async with node.runner(runs, concurrency=2):
            assert await runs.end_of(batch.id) == "completed"
        done = await client.batches.retrieve(batch.id)
        assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
        out = [json.loads(line) for line in (await client.files.content(done.output_file_id)).content.splitlines()]
        assert [line["custom_id"] for line in out] == ["one", "two"]
        bodies = [line["response"]["body"] for line in out]
        assert [len(b["data"]) for b in bodies] == [1, 2] and len(bodies[1]["data"][0]["embedding"]) == 64
        [err] = [json.loads(line) for line in (await client.files.content(done.error_file_id)).content.splitlines()]
        assert err["custom_id"] == "long" and err["error"]["code"] == "context_length_exceeded"
        rows = await node.batch_ledger_rows("local")
        assert {(r.endpoint, r.status) for r in rows} == {("batch:embeddings", 200)} and len(rows) == 2


async def test_a_bad_embedding_line_is_refused_at_upload_naming_the_line_and_field(tmp_path):
    async with serve(tmp_path, EMBED) as (node, _):
        with pytest.raises(openai.BadRequestError) as exc:
            await node.sdk().files.create(file=("in.jsonl", jsonl(embed_line("ok", "x"), embed_line("empty", []))),
                                          purpose="batch")
    body = exc.value.body
    assert body["code"] == "invalid_batch_input" and body["param"] == "body.input" and "line 2" in body["message"]
