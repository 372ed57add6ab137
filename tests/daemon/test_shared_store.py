"""Two daemons sharing one PostgreSQL store (the cluster's shared store): what one node recorded, the
other honours. The PostgreSQL server is a throwaway one the test setup starts (tests/pg_server.py)."""
from __future__ import annotations

import asyncio
import json

import aiohttp
from openai import AsyncOpenAI

from inferd.config.root import load_config
from tests.daemon.harness import running_daemon, sim_model, write_config
from tests.pg_server import pg_dsn, pg_server  # noqa: F401  (fixtures)

BODY = {"model": "sim", "prompt": "hello there", "max_tokens": 5, "temperature": 0}


def node(tmp_path, name: str, dsn: str):
    d = tmp_path / name
    d.mkdir()
    return load_config(write_config(d / "inferd.toml", {"sim": sim_model(time_scale=0.0)},
                                    f'[store]\nbackend = "postgres"\ndsn = "{dsn}"\n'))


async def test_an_idempotency_key_used_on_one_node_is_replayed_by_the_other(tmp_path, pg_dsn):  # noqa: F811
    async with running_daemon(node(tmp_path, "a", pg_dsn)) as (_, _, a), \
            running_daemon(node(tmp_path, "b", pg_dsn)) as (_, _, b), aiohttp.ClientSession() as http:
        async with http.post(a + "/v1/completions", json=BODY, headers={"Idempotency-Key": "shared"}) as resp:
            first = await resp.read()
        async with http.post(b + "/v1/completions", json=BODY, headers={"Idempotency-Key": "shared"}) as resp:
            assert resp.headers["Idempotent-Replayed"] == "true" and await resp.read() == first
        async with http.get(b + "/admin/usage", params={"rows": "true", "format": "jsonl"}) as resp:
            rows = [json.loads(line) for line in (await resp.text()).splitlines()]
        assert len(rows) == 1                      # one ledger for both nodes: the row node A recorded


async def test_a_batch_created_on_a_node_that_does_not_run_batches_is_run_by_the_other(tmp_path, pg_dsn):  # noqa: F811
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": BODY}) + "\n"
    async with running_daemon(node(tmp_path, "a", pg_dsn), run_batches=False) as (_, _, a), \
            running_daemon(node(tmp_path, "b", pg_dsn)) as (_, _, b):
        async with AsyncOpenAI(base_url=a + "/v1", api_key="unused", max_retries=0) as sdk:
            made = await sdk.files.create(file=("in.jsonl", line.encode()), purpose="batch")
            batch = await sdk.batches.create(input_file_id=made.id, endpoint="/v1/completions",
                                             completion_window="24h")
            for _ in range(500):                   # node b's runner polls the shared store every second
                batch = await sdk.batches.retrieve(batch.id)
                if batch.status == "completed":
                    break
                await asyncio.sleep(0.02)
            assert batch.status == "completed" and batch.request_counts.completed == 1


async def test_a_file_uploaded_in_chunks_to_one_node_reads_back_whole_from_the_other(tmp_path, pg_dsn):  # noqa: F811
    from inferd.store import CHUNK_BYTES
    from tests.api.upload_client import big_jsonl

    content = big_jsonl(2 * CHUNK_BYTES + 999)
    async with running_daemon(node(tmp_path, "a", pg_dsn)) as (_, _, a), \
            running_daemon(node(tmp_path, "b", pg_dsn)) as (_, _, b), \
            AsyncOpenAI(base_url=a + "/v1", api_key="unused", max_retries=0) as on_a, \
            AsyncOpenAI(base_url=b + "/v1", api_key="unused", max_retries=0) as on_b:
        made = await on_a.files.create(file=("big.jsonl", content), purpose="batch")
        assert (await on_b.files.content(made.id)).content == content
        assert (await on_b.files.delete(made.id)).deleted
