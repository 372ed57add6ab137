"""inferd.api.routes.files through the real daemon, with the official SDK: uploads checked line by line (errors
name the line), size-limited, per tenant."""
from __future__ import annotations

import aiohttp
import openai
import pytest

from tests.api.batch_harness import chat_line, jsonl, serve


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
