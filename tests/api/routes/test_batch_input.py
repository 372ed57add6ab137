"""inferd.api.routes.batch_input through the real daemon: a batch-file line nested past the bound every body
keeps is refused at upload, the line and the bound named, with no traceback logged; so is a batch's own body.
And a file checked in pieces (LineChecker, as an upload arrives) gives what the whole file gives, lines and errors."""
from __future__ import annotations

import logging

import aiohttp
import openai
import pytest

from inferd.api.routes.batch_input import InputError, LineChecker, parse_lines
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


def in_pieces(content: bytes, size: int, max_line_bytes: int | None = None) -> list:
    checker = LineChecker(max_line_bytes)
    lines = []
    for at in range(0, len(content), size):
        lines += checker.feed(content[at:at + size])
    return lines + checker.finish()


@pytest.mark.parametrize("size", [1, 7, 100, 10_000])
def test_lines_fed_in_pieces_of_any_size_are_the_lines_of_the_whole_file(size):
    content = jsonl(chat_line("a"), chat_line("b"), chat_line("c")) + b"\n  \n"       # blank lines may end it
    assert in_pieces(content, size) == parse_lines(content)
    assert [line.idx for line in in_pieces(content, size)] == [0, 1, 2]


@pytest.mark.parametrize(("content", "says"), [
    (jsonl(chat_line("a")) + b"\n" + jsonl(chat_line("b")), "line 2: empty line"),
    (jsonl(chat_line("a"), chat_line("a")), "line 2: custom_id 'a' is already used on line 1"),
    (jsonl(chat_line("a")) + b"{broken", "line 2: not valid JSON"),
    (b"\n \n", "no requests"),
])
def test_an_error_in_pieces_names_the_line_the_whole_file_names(content, says):
    for size in (3, 1000):
        with pytest.raises(InputError, match=says):
            in_pieces(content, size)
    with pytest.raises(InputError, match=says):
        parse_lines(content)


def test_a_line_past_the_bound_is_refused_before_it_is_whole():
    checker = LineChecker(max_line_bytes=100)
    checker.feed(jsonl(chat_line("a")))
    with pytest.raises(InputError, match="line 2: longer than 100 bytes"):
        checker.feed(b"x" * 101)            # no newline yet: refused without waiting for the rest
