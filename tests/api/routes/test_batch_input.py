"""inferd.api.routes.batch_input through the real daemon: a batch-file line nested past the bound every body
keeps is refused at upload, the line and the bound named, with no traceback logged; so is a batch's own body."""
from __future__ import annotations

import logging

import aiohttp
import openai
import pytest

from inferd.api.wire.json_depth import MAX_DEPTH
from tests.api.batch_harness import chat_line, jsonl, serve

DEEP = 100_000


def _no_traceback(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.parametrize("nested", ["[" * DEEP + "]" * DEEP, '{"a":' * DEEP + "1" + "}" * DEEP])
async def test_a_batch_line_nested_100000_deep_is_refused_naming_the_line_and_the_bound(tmp_path, caplog, nested):
    caplog.set_level(logging.INFO)
    line = '{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"model":"sim","messages":' \
           '[{"role":"user","content":"hi"}],"metadata":%s}}' % nested
    async with serve(tmp_path) as (node, _):
        client = node.sdk()
        with pytest.raises(openai.BadRequestError) as caught:
            await client.files.create(file=("deep.jsonl", jsonl(chat_line("a"), line)), purpose="batch")
        assert f"line 2: the line is nested deeper than {MAX_DEPTH} levels" in caught.value.message
        assert caught.value.body["code"] == "invalid_batch_input"
        _no_traceback(caplog)
        assert (await client.files.create(file=("ok.jsonl", jsonl(chat_line("a"))), purpose="batch")).id


async def test_a_batch_body_nested_100000_deep_is_a_400_naming_the_bound(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    body = '{"input_file_id":"%s","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":%s}'
    async with serve(tmp_path) as (node, _), aiohttp.ClientSession() as http:
        file_id = (await node.sdk().files.create(file=("ok.jsonl", jsonl(chat_line("a"))), purpose="batch")).id
        for nested in ("[" * 20_000 + "]" * 20_000, '{"a":' * 10_000 + "1" + "}" * 10_000):   # within 64 KiB
            async with http.post(node.url + "/v1/batches", data=(body % (file_id, nested)).encode(),
                                 headers={"Content-Type": "application/json"}) as resp:
                error = (await resp.json())["error"]
            assert resp.status == 400 and error["code"] == "invalid_json", error
            assert f"nested deeper than {MAX_DEPTH} levels" in error["message"]
        _no_traceback(caplog)
