"""inferd.api.routes.upload_gate through the real daemon: a tenant's stored file bytes
(max_stored_file_bytes, 413 file_quota_exceeded) and its uploads at once (max_concurrent_uploads, 429); what it
holds, as `inferd usage --files` shows it."""
from __future__ import annotations

import json
import subprocess
import sys

import aiohttp
import openai
import pytest

from inferd.store.files import CHUNK_BYTES
from tests.api.batch_harness import chat_line, jsonl, serve
from tests.api.upload_client import PacedUpload, big_jsonl
from tests.daemon.harness import until

CAPS = "[tenants.acme]\nmax_stored_file_bytes = {cap}\nmax_concurrent_uploads = {uploads}\n"


async def test_an_upload_past_max_stored_file_bytes_is_413_file_quota_exceeded_and_leaves_nothing(tmp_path):
    content = jsonl(*(chat_line(f"id-{i}") for i in range(20)))
    cap = len(content) * 3 // 2
    async with serve(tmp_path, CAPS.format(cap=cap, uploads=4), keys_for=("acme", "globex")) as (node, keys):
        acme, globex = node.sdk(keys[0]), node.sdk(keys[1])
        first = await acme.files.create(file=("a.jsonl", content), purpose="batch")
        with pytest.raises(openai.APIStatusError) as caught:
            await acme.files.create(file=("b.jsonl", content), purpose="batch")
        assert caught.value.status_code == 413
        error = caught.value.body
        assert error["code"] == "file_quota_exceeded" and error["param"] == "file"
        assert "max_stored_file_bytes" in error["message"] and str(cap) in error["message"]
        assert [f.id for f in (await acme.files.list()).data] == [first.id]
        assert len(await node.daemon.state.store.query("SELECT idx FROM file_chunks")) == 1     # the first file's
        await globex.files.create(file=("g.jsonl", content), purpose="batch")      # another tenant's own cap
        await acme.files.delete(first.id)                                           # room again
        await acme.files.create(file=("b.jsonl", content), purpose="batch")


async def test_a_quota_is_counted_as_the_bytes_arrive_without_a_content_length(tmp_path):
    cap = 2 * CHUNK_BYTES
    async with serve(tmp_path, CAPS.format(cap=cap, uploads=4), keys_for=("acme",)) as (node, (key,)), \
            aiohttp.ClientSession() as http:
        upload = PacedUpload(node.url, key, big_jsonl(3 * CHUNK_BYTES), pieces=1, content_length=False)
        status, body = await upload.start(http).task
        assert status == 413 and body["error"]["code"] == "file_quota_exceeded"
        assert await node.daemon.state.store.query("SELECT idx FROM file_chunks") == []


async def test_uploads_past_max_concurrent_uploads_are_429_with_retry_after(tmp_path):
    async with serve(tmp_path, CAPS.format(cap=1 << 30, uploads=1), keys_for=("acme", "globex")) as (node, keys), \
            aiohttp.ClientSession() as http:
        running = PacedUpload(node.url, keys[0], big_jsonl(3 * CHUNK_BYTES), pieces=2).start(http)

        async def receiving() -> bool:
            return bool(await node.daemon.state.store.query("SELECT idx FROM file_chunks"))
        await until(receiving, "the first upload to be under way")
        with pytest.raises(openai.RateLimitError) as caught:
            await node.sdk(keys[0]).files.create(file=("b.jsonl", jsonl(chat_line("b"))), purpose="batch")
        assert caught.value.body["code"] == "too_many_concurrent_uploads"
        assert "max_concurrent_uploads = 1" in caught.value.message
        assert int(caught.value.response.headers["Retry-After"]) >= 1
        await node.sdk(keys[1]).files.create(file=("g.jsonl", jsonl(chat_line("g"))), purpose="batch")   # not globex
        running.release()
        status, made = await running.task
        assert status == 200 and made["bytes"] > 2 * CHUNK_BYTES
        await node.sdk(keys[0]).files.create(file=("b.jsonl", jsonl(chat_line("b"))), purpose="batch")  # slot free


async def test_a_tenants_stored_file_bytes_files_and_batches_are_in_inferd_usage_files(tmp_path):
    content = jsonl(chat_line("a"), chat_line("b"))
    async with serve(tmp_path, keys_for=("acme", "globex")) as (node, keys):
        acme = node.sdk(keys[0])
        made = [await acme.files.create(file=(f"{i}.jsonl", content), purpose="batch") for i in range(2)]
        await acme.batches.create(input_file_id=made[0].id, endpoint="/v1/chat/completions", completion_window="24h")
        cli = subprocess.run([sys.executable, "-m", "inferd", "usage", "--files", "--config",
                              str(tmp_path / "inferd.toml"), "--format", "jsonl"],
                             capture_output=True, text=True, timeout=60)        # beside the running daemon
    assert cli.returncode == 0, cli.stderr
    assert [json.loads(line) for line in cli.stdout.splitlines()] == [
        {"tenant": "acme", "file_bytes": 2 * len(content), "files": 2, "batches": 1}]
