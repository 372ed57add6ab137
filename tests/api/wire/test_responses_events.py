"""The typed events of a streamed response, as the SSE writer drives the encoder (content ..., final, usage,
done; or error), with text only and with a tool call parser's pieces."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from inferd.api.errors import ApiError
from inferd.api.wire.responses import Identity
from inferd.api.wire.responses_events import ResponseEventEncoder
from inferd.api.wire.responses_output import ended_normally
from inferd.types import Usage

IDENT = Identity("responses", "resp_1", 100, "m@v", "fp")
ECHO = {"store": True, "instructions": None}


def events(frames: bytes) -> list[dict]:
    out = []
    for frame in frames.decode().split("\n\n"):
        if frame.startswith("event: "):
            name, data = frame.split("\n", 1)
            body = json.loads(data.removeprefix("data: "))
            assert body["type"] == name.removeprefix("event: ")
            out.append(body)
    return out


def test_a_stream_is_created_then_its_deltas_then_the_done_events_and_completed_with_usage():
    enc = ResponseEventEncoder(IDENT, ECHO)
    frames = enc.content("Hel") + enc.content("lo") + enc.final("!", "stop") + enc.usage(Usage(prompt_tokens=3, completion_tokens=4)) + enc.done(None)
    got = events(frames)
    assert [e["type"] for e in got] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert got[0]["response"]["status"] == "in_progress" and got[0]["response"]["id"] == "resp_1"
    assert {e["item_id"] for e in got[3:9]} == {got[2]["item"]["id"]} == {got[9]["item"]["id"]}
    done = got[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == "Hello!"
    assert done["usage"] == {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7,
                             "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                             "output_tokens_details": {"reasoning_tokens": 0}}
    assert ended_normally(frames)


def test_a_length_cut_ends_incomplete_naming_max_output_tokens():
    enc = ResponseEventEncoder(IDENT, ECHO)
    got = events(enc.final("abc", "length") + enc.usage(Usage(prompt_tokens=1, completion_tokens=3)) + enc.done(None))
    assert got[-1]["type"] == "response.incomplete"
    assert got[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert got[-2]["item"]["status"] == "incomplete"


def test_held_done_sends_the_closing_event_only_when_the_writer_asks():
    enc = ResponseEventEncoder(IDENT, ECHO, hold_done=True)
    head = enc.final("x", "stop") + enc.usage(Usage(prompt_tokens=1, completion_tokens=1)) + enc.done(None)
    assert events(head)[-1]["type"] == "response.output_item.done"
    assert events(enc.held_done())[0]["type"] == "response.completed"


def test_an_abnormal_end_is_an_error_event_then_failed_and_no_done_sentinel():
    enc = ResponseEventEncoder(IDENT, ECHO)
    err = ApiError(504, "too late", code="deadline_exceeded")
    frames = enc.content("a") + enc.error(err, None) + enc.closing + enc.done(None)
    got = events(frames)
    assert [e["type"] for e in got[-2:]] == ["error", "response.failed"]
    assert got[-2]["code"] == "deadline_exceeded" and got[-2]["message"] == "too late"
    failed = got[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"     # one of OpenAI's codes
    assert [(i["type"], i["status"], i["content"][0]["text"]) for i in failed["output"]] == [
        ("message", "incomplete", "a")]                                           # what was already streamed
    assert b"[DONE]" not in frames and not ended_normally(frames)
    assert enc.held_done() == b""               # the writer's ask after an abnormal end: nothing more


@pytest.mark.parametrize(("status", "code"), [(504, "server_error"), (500, "server_error"), (503, "server_error"),
                                              (400, "invalid_prompt"), (429, "rate_limit_exceeded")])
def test_a_failed_responses_error_code_is_one_of_openais(status, code):
    got = events(ResponseEventEncoder(IDENT, ECHO).error(ApiError(status, "no", code="grammar_dead_end"), None))
    assert got[-1]["response"]["error"]["code"] == code and got[-2]["code"] == "grammar_dead_end"


def test_a_refusal_before_any_output_says_created_then_failed():
    got = events(ResponseEventEncoder(IDENT, ECHO).error(ApiError(429, "later", code="queue_full"), None))
    assert [e["type"] for e in got] == ["response.created", "response.in_progress", "error", "response.failed"]


class FakeParser:
    """A tool call parser's shape (inferd.api.wire.tool_calls): pieces as they would come out of feed/close."""

    def __init__(self, fed: list[list], closed: list) -> None:
        self.fed, self.closed = fed, closed

    def feed(self, text: str) -> list:
        return self.fed.pop(0) if self.fed else []

    def close(self) -> list:
        return self.closed


@dataclass
class Text:
    text: str


@dataclass
class Call:
    index: int
    id: str
    name: str


@dataclass
class Args:
    index: int
    text: str


def test_a_call_closes_the_message_before_it_and_streams_its_arguments():
    parser = FakeParser([[Text("Let me look. ")], [], [Call(0, "call_1", "get"), Args(0, '{"q":')]],
                        [Args(0, ' 1}')])
    enc = ResponseEventEncoder(IDENT, ECHO, parser=parser)
    frames = enc.content("a") + enc.content("<tool") + enc.content("...") + enc.final("", "stop")
    got = events(frames)
    assert [e["type"] for e in got[2:]] == [
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done"]
    call = got[-1]["item"]
    assert call["type"] == "function_call" and call["call_id"] == "call_1" and call["name"] == "get"
    assert call["arguments"] == got[-2]["arguments"] == '{"q": 1}' and got[-1]["output_index"] == 1
    assert [i["type"] for i in enc.response["output"]] == ["message", "function_call"]


def test_each_item_is_done_before_the_next_is_added_and_the_output_keeps_that_order():
    parser = FakeParser([[Call(0, "call_1", "a"), Args(0, "{}")], [Call(1, "call_2", "b"), Args(1, "{}")],
                         [Text("so")]], [])
    enc = ResponseEventEncoder(IDENT, ECHO, parser=parser)
    got = events(enc.content("x") + enc.content("y") + enc.content("z") + enc.final("", "stop"))
    opened: set[int] = set()
    for e in got:
        if e["type"] == "response.output_item.added":
            assert not opened, "an item was added while another was open"
            opened.add(e["output_index"])
        elif e["type"] == "response.output_item.done":
            opened.remove(e["output_index"])
    done = [e["item"] for e in got if e["type"] == "response.output_item.done"]
    assert [i.get("name", i["type"]) for i in done] == ["a", "b", "message"]
    assert [i.get("name", i["type"]) for i in enc.response["output"]] == ["a", "b", "message"]


def test_held_back_text_is_no_frame():
    enc = ResponseEventEncoder(IDENT, ECHO, parser=FakeParser([[]], []))
    assert enc.content("<tool_ca") == b""
