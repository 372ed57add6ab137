"""The whole Response: output items from text and tool call pieces, the status a finish gives, the request
repeated, and whether a sent event stream ended normally."""
from __future__ import annotations

from dataclasses import dataclass

from inferd.api.wire.responses import Identity
from inferd.api.wire.responses_output import ended_normally, finished_response, output_items
from inferd.types import Usage

IDENT = Identity("responses", "resp_1", 100, "m@v", "fp")


@dataclass
class Call:
    index: int
    id: str
    name: str


@dataclass
class Args:
    index: int
    text: str


def test_the_whole_response_repeats_its_request_and_says_why_it_is_incomplete():
    items = output_items(["te", "xt"], "incomplete")
    body = finished_response(IDENT, {"store": True}, items, "content_filter", Usage(prompt_tokens=2, completion_tokens=1))
    assert body["object"] == "response" and body["created_at"] == 100 and body["model"] == "m@v"
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "content_filter"}
    assert body["store"] is True and body["output"][0]["content"][0]["text"] == "text"
    assert body["output"][0]["id"].startswith("msg_") and body["usage"]["total_tokens"] == 3


def test_calls_are_function_call_items_and_blank_text_around_them_is_no_message():
    items = output_items(["\n", Call(0, "call_a", "f"), Args(0, "{}"), Call(1, "call_b", "g"), Args(1, '{"x"'),
                          Args(1, ": 1}")], "completed")
    assert [(i["type"], i["call_id"], i["name"], i["arguments"]) for i in items] == [
        ("function_call", "call_a", "f", "{}"), ("function_call", "call_b", "g", '{"x": 1}')]
    assert all(i["id"].startswith("fc_") and i["status"] == "completed" for i in items)


def test_an_empty_output_is_one_empty_message():
    assert [i["content"][0]["text"] for i in output_items([], "completed")] == [""]


def test_a_stream_ended_normally_only_with_its_closing_event():
    assert ended_normally(b"event: response.completed\ndata: {}\n\n")
    assert ended_normally(b": server-timing x\n\nevent: response.incomplete\ndata: {}\n\n")
    assert not ended_normally(b"event: response.failed\ndata: {}\n\n")


def test_items_keep_the_order_the_stream_adds_them_in():
    items = output_items([Call(0, "call_a", "f"), Args(0, "{}"), "so ", "then", Call(1, "call_b", "g"),
                          Args(1, "{}"), "done"], "completed")
    assert [i.get("name") or i["content"][0]["text"] for i in items] == ["f", "so then", "g", "done"]
