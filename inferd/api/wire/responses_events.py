"""OpenAI's Responses API streamed: the typed events of one response, as the SSE writer drives an encoder.

`ResponseEventEncoder` takes the writer's calls of a ChunkEncoder (content / final / usage / done / error,
inferd.api.streaming.sse), so the streaming loop, heartbeats, disconnects and the ledger's hold on the
stream's end are chat's. Its events, each with a `sequence_number` from 0: response.created,
response.in_progress, then per output item response.output_item.added ... response.output_item.done
(a message: response.content_part.added, response.output_text.delta ..., response.output_text.done,
response.content_part.done; a function call: response.function_call_arguments.delta ...,
response.function_call_arguments.done), then response.completed (or response.incomplete when
max_output_tokens or the content filter cut it). An abnormal end is an `error` event and response.failed.
There is no `[DONE]`, as OpenAI's. With tools in play the text goes through the tool call parser
(inferd.api.wire.tool_calls) first; text it holds back (a call may be starting) is no frame at all.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from inferd.api.errors import ApiError
from inferd.api.wire.responses import Identity
from inferd.api.wire.responses_output import (STATUS, call_item, finished_response, kind_of, message_item,
                                              new_item_id, response_object, usage_object)
from inferd.types import EngineTiming, Usage

if TYPE_CHECKING:
    from inferd.api.pipeline.timeline import Timeline

_EMPTY_PART = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}


class ResponseEventEncoder:
    """The SSE frames of one streamed response."""

    running = None                      # no continuous usage: the final event carries it
    closing = b""                       # no `[DONE]` after an error: response.failed ends the stream

    def __init__(self, ident: Identity, echo: dict, *, hold_done: bool = False, timeline: Timeline | None = None,
                 parser: Any = None) -> None:
        self._ident = ident
        self._echo = echo
        self.hold_done = hold_done      # the ledger's commit (and the store's) come before the last event
        self.timeline = timeline
        self._parser = parser           # a ToolCallParser (tools in play), or None
        self._seq = 0
        self._started = False
        self._items: list[dict] = []    # the output so far, in order
        self._message: int | None = None            # the output index of the message being written
        self._text: list[str] = []
        self._calls: dict[int, int] = {}            # a call's parser index -> its output index
        self.response: dict | None = None           # the final Response, once final() and usage() have run
        self.failed = False

    def _event(self, kind: str, body: dict) -> bytes:
        body["type"] = kind
        body["sequence_number"] = self._seq
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        head = response_object(self._ident, self._echo, status="in_progress", output=[])
        return self._event("response.created", {"response": head}) + \
            self._event("response.in_progress", {"response": head})

    def _added(self, item: dict, shown: dict) -> bytes:
        self._items.append(item)
        return self._event("response.output_item.added", {"output_index": len(self._items) - 1, "item": shown})

    def _text_piece(self, text: str) -> bytes:
        frames = b""
        if self._message is None:
            frames = self._close_calls("completed")     # each item is done before the next is added, as OpenAI's
            item = message_item(new_item_id(), "", "in_progress")
            frames += self._added(item, {**item, "content": []})
            self._message = len(self._items) - 1
            frames += self._event("response.content_part.added", {"item_id": item["id"], "output_index": self._message,
                                                                  "content_index": 0, "part": _EMPTY_PART})
        if not text:                        # an empty output's message: opened, with nothing in it
            return frames
        self._text.append(text)
        return frames + self._event("response.output_text.delta", {
            "item_id": self._items[self._message]["id"], "output_index": self._message, "content_index": 0,
            "delta": text, "logprobs": []})

    def _close_message(self, status: str) -> bytes:
        if self._message is None:
            return b""
        index, self._message = self._message, None
        item = self._items[index] = message_item(self._items[index]["id"], "".join(self._text), status)
        self._text = []
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return b"".join((self._event("response.output_text.done", {**where, "text": part["text"], "logprobs": []}),
                         self._event("response.content_part.done", {**where, "part": part}),
                         self._event("response.output_item.done", {"output_index": index, "item": item})))

    def _call_started(self, piece: Any) -> bytes:
        frames = self._close_message("completed") + self._close_calls("completed")     # the items before are whole
        item = call_item(piece.id, piece.name, "", "in_progress")
        frames += self._added(item, dict(item))
        self._calls[piece.index] = len(self._items) - 1
        return frames

    def _arguments(self, piece: Any) -> bytes:
        index = self._calls[piece.index]
        item = self._items[index]
        item["arguments"] += piece.text
        return self._event("response.function_call_arguments.delta",
                           {"item_id": item["id"], "output_index": index, "delta": piece.text})

    def _close_calls(self, status: str) -> bytes:
        frames = []
        for index in self._calls.values():
            item = self._items[index]
            item["status"] = status
            frames.append(self._event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": index, "name": item["name"], "arguments": item["arguments"]}))
            frames.append(self._event("response.output_item.done", {"output_index": index, "item": dict(item)}))
        self._calls = {}
        return b"".join(frames)

    def _pieces(self, pieces: list[Any]) -> bytes:
        handlers: dict[str, Callable[[Any], bytes]] = {
            "text": lambda p: self._text_piece(p if isinstance(p, str) else p.text),
            "call": self._call_started, "arguments": self._arguments}
        return b"".join(handlers[kind_of(p)](p) for p in pieces if not (isinstance(p, str) and not p))

    def content(self, text: str) -> bytes:
        pieces = self._parser.feed(text) if self._parser is not None else [text]
        if not pieces:
            return b""
        return self._start() + self._pieces(pieces)

    def content_with_usage(self, text: str, tokens: int) -> bytes:
        return self.content(text)

    def final(self, text: str, finish: str, tokens: int = 0) -> bytes:
        """The last pieces, then every open item done."""
        pieces = [text] if self._parser is None else self._parser.feed(text) + self._parser.close()
        frames = [self._start(), self._pieces(pieces)]
        if not self._items:                 # nothing at all: one empty message, as the body has
            frames.append(self._text_piece(""))
        status = STATUS[finish][0]
        frames += [self._close_message(status), self._close_calls(status)]
        self.response = finished_response(self._ident, self._echo, self._items, finish, None)
        return b"".join(frames)

    def usage(self, usage: Usage) -> bytes:
        if self.response is not None:
            self.response["usage"] = usage_object(usage)
        return b""

    def held_done(self) -> bytes:
        """The closing event: response.completed, or response.incomplete (nothing after an abnormal end: its
        response.failed was the last event; the writer still asks, as the ledger records every end)."""
        if self.failed or self.response is None:
            return b""
        kind = "response.completed" if self.response["status"] == "completed" else "response.incomplete"
        return self._event(kind, {"response": self.response})

    def done(self, usage: Usage | None, timing: EngineTiming | None = None) -> bytes:
        """The closing event (nothing when `hold_done`: the writer sends held_done() later), after a
        `: server-timing` comment, which clients ignore."""
        comment = b""
        if self.timeline is not None:
            comment = b": server-timing " + self.timeline.server_timing(timing, time.monotonic()).encode() + b"\n\n"
        if self.failed or self.hold_done or self.response is None:
            return comment
        return comment + self.held_done()

    def error(self, err: ApiError, usage: Usage | None) -> bytes:
        """An abnormal end: an `error` event, then response.failed."""
        self.failed = True
        start = self._start()
        body = err.body()
        failed = response_object(self._ident, self._echo, status="failed", output=self._so_far(), usage=usage,
                                 error={"code": response_error_code(err.status), "message": body["message"]})
        return b"".join((start, self._event("error", {"code": body.get("code"), "message": body["message"],
                                                      "param": body.get("param")}),
                         self._event("response.failed", {"response": failed})))

    def _so_far(self) -> list[dict]:
        """The items already streamed, as they stand: an open one is "incomplete" (its text so far)."""
        items = [dict(item) for item in self._items]
        if self._message is not None:
            items[self._message] = message_item(items[self._message]["id"], "".join(self._text), "incomplete")
        for index in self._calls.values():
            items[index]["status"] = "incomplete"
        return items


def response_error_code(status: int) -> str:
    """A failed Response's error.code: one of OpenAI's ResponseError codes (openai/types/responses/
    response_error.py), which has none for a deadline, an engine error or a grammar dead end: a 429 is
    rate_limit_exceeded, another 4xx (what the request asked for cannot be produced) invalid_prompt, anything
    else server_error. inferd's own code (deadline_exceeded, engine_error, ...) is the `error` event's."""
    if status == 429:
        return "rate_limit_exceeded"
    return "invalid_prompt" if 400 <= status < 500 else "server_error"
