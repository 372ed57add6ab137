"""inferd.api.routes.files through the real daemon, with the official SDK: uploads checked line by line (errors
name the line), size-limited, per tenant."""
from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from inferd.config.root import load_config
from inferd.store.disk_reserve import RESERVE_BYTES
from inferd.store.files import CHUNK_BYTES
from tests.api.batch_harness import chat_line, jsonl, serve
from tests.api.upload_client import PacedUpload, big_jsonl
from tests.daemon.harness import running_daemon, sim_model, until, write_config


async def test_an_uploaded_batch_file_reads_back_lists_and_deletes(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        content = jsonl(chat_line("a"), chat_line("b"))
        made = await client.files.create(file=("requests.jsonl", content), purpose="batch")
        assert made.id.startswith("file-") and made.object == "file" and made.purpose == "batch"
        assert made.filename == "requests.jsonl" and made.bytes == len(content) and made.status == "processed"
        assert (await client.files.retrieve(made.id)).id == made.id
        assert (await client.files.content(made.id)).content == content
        page = await client.files.list()
        assert [f.id for f in page.data] == [made.id]
        deleted = await client.files.delete(made.id)
        assert deleted.deleted and deleted.id == made.id
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve(made.id)


@pytest.mark.parametrize(("content", "says"), [
    (jsonl(chat_line("a"), "{not json"), "line 2: not valid JSON"),
    (jsonl(chat_line("a"), chat_line("b"), chat_line("a")), "line 3: custom_id 'a' is already used on line 1"),
    (jsonl(chat_line("a"), chat_line("b", model="no-such-model")), "line 2: body.model"),
    (jsonl(chat_line("a", temperature="hot")), "line 1: body.temperature"),
    (jsonl({**chat_line("a"), "url": "/v1/moderations"}), "line 1: url must be one of"),
    (jsonl({**chat_line("a"), "method": "GET"}), "line 1: method must be"),
    (jsonl(chat_line("a", stream=True)), "line 1: body.stream"),
    (jsonl({"custom_id": "a", "method": "POST", "url": "/v1/completions"}), "line 1: missing required field 'body'"),
    (jsonl("[1, 2]"), "line 1: expected a JSON object"),
    (b"\n\n", "no requests"),
])
async def test_a_bad_file_is_refused_with_the_line_named(tmp_path, content, says):
    async with serve(tmp_path) as (node, _):
        with pytest.raises(openai.BadRequestError) as caught:
            await node.sdk().files.create(file=("bad.jsonl", content), purpose="batch")
        assert says in caught.value.message
        assert (await node.sdk().files.list()).data == []


async def test_a_file_over_store_max_file_bytes_is_413_and_other_purposes_are_400(tmp_path):
    async with serve(tmp_path, "[store]\nmax_file_bytes = 2000\n") as (node, _):
        client = node.sdk()
        big = jsonl(*(chat_line(f"id-{i}") for i in range(30)))
        assert len(big) > 2000
        with pytest.raises(openai.APIStatusError) as caught:
            await client.files.create(file=("big.jsonl", big), purpose="batch")
        assert caught.value.status_code == 413 and "2000 bytes" in caught.value.message
        with pytest.raises(openai.BadRequestError) as caught:
            await client.files.create(file=("x.jsonl", jsonl(chat_line("a"))), purpose="fine-tune")
        assert caught.value.body["param"] == "purpose"


async def test_only_multipart_form_data_with_both_fields_is_accepted(tmp_path):
    async with serve(tmp_path) as (node, _), aiohttp.ClientSession() as http:
        async with http.post(node.url + "/v1/files", json={"purpose": "batch"}) as resp:
            assert resp.status == 415 and (await resp.json())["error"]["code"] == "unsupported_media_type"
        form = aiohttp.FormData()
        form.add_field("file", jsonl(chat_line("a")), filename="a.jsonl")
        async with http.post(node.url + "/v1/files", data=form) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "purpose"
        form = aiohttp.FormData(default_to_multipart=True)
        form.add_field("purpose", "batch")
        form.add_field("extra", "x")
        async with http.post(node.url + "/v1/files", data=form) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "extra"


async def test_another_tenants_file_is_not_found(tmp_path):
    async with serve(tmp_path, keys_for=("acme", "globex")) as (node, (acme_key, globex_key)):
        acme, globex = node.sdk(acme_key), node.sdk(globex_key)
        made = await acme.files.create(file=("a.jsonl", jsonl(chat_line("a"))), purpose="batch")
        for call in (globex.files.retrieve, globex.files.content, globex.files.delete):
            with pytest.raises(openai.NotFoundError):
                await call(made.id)
        assert (await globex.files.list()).data == []
        assert (await acme.files.retrieve(made.id)).id == made.id
        with pytest.raises(openai.AuthenticationError):
            await node.sdk("sk-wrong").files.list()


async def _chunks(node) -> list[tuple[str, int, int]]:
    return await node.daemon.state.store.query("SELECT file_id, idx, LENGTH(data) FROM file_chunks ORDER BY 1, 2")


async def test_a_file_of_many_chunks_is_stored_in_bounded_chunks_and_reads_back_byte_identical(tmp_path):
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        content = big_jsonl(3 * CHUNK_BYTES + 12_345)
        made = await client.files.create(file=("big.jsonl", content), purpose="batch")
        assert made.bytes == len(content)
        assert (await client.files.content(made.id)).content == content
        chunks = await _chunks(node)
        assert [(f, i) for f, i, _ in chunks] == [(made.id, i) for i in range(4)]
        assert max(n for _, _, n in chunks) <= CHUNK_BYTES and sum(n for _, _, n in chunks) == len(content)
        batch = await client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        assert batch.request_counts.total == content.count(b"\n")          # read back chunk by chunk
        await client.files.delete(made.id)
        assert await _chunks(node) == []


async def test_a_file_stored_whole_in_its_row_by_an_older_inferd_still_reads(tmp_path):
    async with serve(tmp_path) as (node, _):
        content = jsonl(chat_line("a"), chat_line("b"))
        await node.daemon.state.store.execute(
            "INSERT INTO files (id, tenant, purpose, filename, bytes, created_at, expires_at, status, content) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", ("file-old", "local", "batch", "old.jsonl", len(content), 1.0, None,
                                                    "processed", content))
        client = node.sdk()
        assert (await client.files.content("file-old")).content == content
        batch = await client.batches.create(input_file_id="file-old", endpoint="/v1/chat/completions",
                                            completion_window="24h")
        assert batch.request_counts.total == 2


async def test_a_bad_line_past_the_first_chunks_leaves_nothing_stored(tmp_path):
    async with serve(tmp_path) as (node, _):
        content = big_jsonl(2 * CHUNK_BYTES) + b"{not json\n"
        with pytest.raises(openai.BadRequestError) as caught:
            await node.sdk().files.create(file=("bad.jsonl", content), purpose="batch")
        assert "not valid JSON" in caught.value.message
        assert await _chunks(node) == [] and (await node.sdk().files.list()).data == []


async def test_a_line_longer_than_a_request_body_may_be_is_refused_naming_it(tmp_path):
    async with serve(tmp_path) as (node, _):      # server.max_body_bytes: 1 MiB
        content = jsonl(chat_line("a"), chat_line("b", "y" * 2 * 1024 * 1024))
        with pytest.raises(openai.BadRequestError) as caught:
            await node.sdk().files.create(file=("long.jsonl", content), purpose="batch")
        assert "line 2: longer than" in caught.value.message and "max_body_bytes" in caught.value.message
        assert await _chunks(node) == []


async def test_an_upload_whose_client_leaves_midway_leaves_no_row_and_no_chunks(tmp_path):
    async with serve(tmp_path) as (node, _), aiohttp.ClientSession() as http:
        upload = PacedUpload(node.url, "none", big_jsonl(3 * CHUNK_BYTES), pieces=2).start(http)

        async def some_chunks_written() -> bool:
            return len(await _chunks(node)) > 0
        await until(some_chunks_written, "the first chunk to be committed")
        upload.task.cancel()                    # the client goes away with the upload half sent

        async def all_gone() -> bool:
            return await _chunks(node) == []
        await until(all_gone, "the aborted upload's chunks to be deleted")
        assert (await node.sdk().files.list()).data == []


@contextlib.contextmanager
def small_disk(path: Path, size_mib: int) -> Iterator[None]:
    """A tmpfs of `size_mib` at `path`: a disk that really fills (ENOSPC), for root on Linux only."""
    path.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
                          capture_output=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> None:
    """Write a file in `directory` until the disk is full."""
    with (directory / "filler").open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)


async def test_a_file_is_deleted_on_a_full_disk_and_the_space_reused(tmp_path):
    with small_disk(tmp_path / "state", 24):
        async with serve(tmp_path) as (node, _):
            client = node.sdk()
            made = await client.files.create(file=("big.jsonl", big_jsonl(2 * CHUNK_BYTES)), purpose="batch")
            fill(tmp_path / "state")
            with pytest.raises(openai.APIStatusError):      # the disk is full: nothing new is written
                await client.files.create(file=("more.jsonl", big_jsonl(2 * CHUNK_BYTES, "m")), purpose="batch")
            deleted = await client.files.delete(made.id)
            assert deleted.deleted
            with pytest.raises(openai.NotFoundError):
                await client.files.retrieve(made.id)
            again = await client.files.create(file=("a.jsonl", big_jsonl(CHUNK_BYTES, "a")), purpose="batch")
            assert (await client.files.retrieve(again.id)).bytes > CHUNK_BYTES      # the freed pages, reused
            (tmp_path / "state" / "filler").unlink()
            await client.files.delete(again.id)             # room again: the reserve is made anew
            assert (tmp_path / "state" / "inferd.db.reserve").stat().st_size == RESERVE_BYTES


async def test_uploads_are_paced_to_the_node_rate_and_a_paced_upload_outlives_the_body_deadline(tmp_path):
    # 3 MiB at 1 MiB/s takes about 2 s past its first chunk; the body's total deadline is 1 s. Each read
    # keeps that deadline, the whole paced body does not: the upload completes.
    path = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)},
                        f"[store]\nupload_bytes_per_s = {CHUNK_BYTES}\n")
    path.write_text(path.read_text().replace("[server]\n", "[server]\nbody_timeout_s = 1.0\n", 1))
    async with running_daemon(load_config(path), run_batches=False) as (daemon, _, url):
        client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        content = big_jsonl(3 * CHUNK_BYTES)
        loop = asyncio.get_running_loop()
        started = loop.time()
        made = await client.files.create(file=("big.jsonl", content), purpose="batch")
        paced_for = loop.time() - started
        assert (await client.files.content(made.id)).content == content
        await client.close()
    assert paced_for >= 1.0             # 3 chunks at one a second: the pace held (a lower bound only)


async def test_an_upload_that_stops_sending_is_cut_after_one_read_timeout_and_leaves_nothing(tmp_path):
    path = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)})
    path.write_text(path.read_text().replace("[server]\n", "[server]\nbody_timeout_s = 1.0\n", 1))
    async with running_daemon(load_config(path), run_batches=False) as (daemon, _, url), \
            aiohttp.ClientSession() as http:
        upload = PacedUpload(url, "none", big_jsonl(3 * CHUNK_BYTES), pieces=2).start(http)   # never released
        status, body = await upload.task
        assert status == 408 and body["error"]["code"] == "request_timeout"
        assert await daemon.state.store.query("SELECT COUNT(*) FROM file_chunks") == [(0,)]
