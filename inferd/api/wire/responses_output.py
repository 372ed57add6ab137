"""OpenAI's Responses API, response side: the Response object and its stream of typed events.

`ResponseEventEncoder` is the SSE writer's encoder for a /v1/responses stream (the calls the writer makes
are ChunkEncoder's: content / final / usage / done / error, inferd.api.streaming.sse), so the streaming
loop, heartbeats, disconnects and the ledger's hold on the stream's end are chat's. Its events, each with
a `sequence_number`: response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta ..., response.output_text.done,
response.content_part.done, response.output_item.done, then response.completed (or response.incomplete
when max_output_tokens or the content filter cut it); an abnormal end is an `error` event and
response.failed. There is no `[DONE]`, as OpenAI's.
"""
from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

import msgspec
import orjson

from inferd.api.errors import ApiError
from inferd.api.wire.responses import Identity
from inferd.types import EngineTiming, Usage

if TYPE_CHECKING:
    from inferd.api.pipeline.timeline import Timeline
    from inferd.api.wire.responses_request import ResponsesRequest

# A finish_reason (OpenAI's, inferd.api.wire.responses.OPENAI_FINISH) -> (status, incomplete_details.reason).
STATUS = {"stop": ("completed", None), "length": ("incomplete", "max_output_tokens"),
          "content_filter": ("incomplete", "content_filter")}


_CLOSING_EVENTS = (b"event: response.completed\n", b"event: response.incomplete\n")


def ended_normally(stream: bytes) -> bool:
    """Whether a /v1/responses event stream, as sent, ends with its closing event (not response.failed)."""
    return stream.rstrip(b"\n").rsplit(b"\n\n", 1)[-1].startswith(_CLOSING_EVENTS)


def echo_of(req: ResponsesRequest, stored: bool) -> dict:
    """What a Response repeats of its request (whether it is stored: `stored`)."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    text = {"format": {"type": "text"} if fmt is None else msgspec.to_builtins(fmt)}
    return {"instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {}, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "store": stored, "temperature": req.temperature,
            "text": text, "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "top_p": req.top_p, "truncation": "disabled", "background": False, "user": req.user}


def usage_object(usage: Usage | None) -> dict | None:
    if usage is None:
        return None
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}


def new_item_id() -> str:
    return "msg_" + secrets.token_hex(12)


def message_item(item_id: str, text: str, status: str) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def response_object(ident: Identity, echo: dict, *, status: str, output: list[dict], usage: Usage | None = None,
                    incomplete: str | None = None, error: dict | None = None) -> dict:
    body = {"id": ident.id, "object": "response", "created_at": ident.created, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None, "model": ident.model,
            "output": output, "usage": usage_object(usage)}
    body.update(echo)
    return body


def finished_response(ident: Identity, echo: dict, item_id: str, text: str, finish: str, usage: Usage | None) -> dict:
    """The whole Response of a generation that ended with OpenAI finish_reason `finish`."""
    status, reason = STATUS[finish]
    return response_object(ident, echo, status=status, output=[message_item(item_id, text, status)], usage=usage,
                           incomplete=reason)


class ResponseEventEncoder:
    """The SSE frames of one streamed response (one output message)."""

    running = None                      # no continuous usage: the final event carries it
    closing = b""                       # no `[DONE]` after an error: response.failed ends the stream

    def __init__(self, ident: Identity, echo: dict, *, hold_done: bool = False,
                 timeline: Timeline | None = None) -> None:
        self._ident = ident
        self._echo = echo
        self.hold_done = hold_done      # the ledger's commit (and the store's) come before the last event
        self.timeline = timeline
        self._seq = 0
        self._started = False
        self._item = new_item_id()
        self._text: list[str] = []
        self._finish: str | None = None
        self.response: dict | None = None   # the final Response, once final() and usage() have run
        self.failed = False

    def _event(self, kind: str, body: dict) -> bytes:
        body["type"] = kind
        body["sequence_number"] = self._seq
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"

    def _part(self, kind: str, **body) -> bytes:
        return self._event(kind, {"item_id": self._item, "output_index": 0, "content_index": 0, **body})

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        head = response_object(self._ident, self._echo, status="in_progress", output=[])
        return b"".join((self._event("response.created", {"response": head}),
                         self._event("response.in_progress", {"response": head}),
                         self._event("response.output_item.added",
                                     {"output_index": 0, "item": message_item(self._item, "", "in_progress")
                                      | {"content": []}}),
                         self._part("response.content_part.added",
                                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})))

    def content(self, text: str) -> bytes:
        self._text.append(text)
        return self._start() + self._part("response.output_text.delta", delta=text, logprobs=[])

    def content_with_usage(self, text: str, tokens: int) -> bytes:
        return self.content(text)

    def final(self, text: str, finish: str, tokens: int = 0) -> bytes:
        """The last text, then the text, part and item done."""
        frames = [self.content(text) if text else self._start()]
        whole = "".join(self._text)
        self._finish = finish
        status = STATUS[finish][0]
        frames.append(self._part("response.output_text.done", text=whole, logprobs=[]))
        frames.append(self._part("response.content_part.done",
                                 part={"type": "output_text", "text": whole, "annotations": [], "logprobs": []}))
        frames.append(self._event("response.output_item.done",
                                  {"output_index": 0, "item": message_item(self._item, whole, status)}))
        self.response = finished_response(self._ident, self._echo, self._item, whole, finish, None)
        return b"".join(frames)

    def usage(self, usage: Usage) -> bytes:
        if self.response is not None:
            self.response["usage"] = usage_object(usage)
        return b""

    def held_done(self) -> bytes:
        """The closing event: response.completed, or response.incomplete."""
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
        start = b""
        if not self._started:       # refused before any output: the response was created, then failed
            self._started = True
            start = self._event("response.created", {"response": response_object(
                self._ident, self._echo, status="in_progress", output=[])})
        body = err.body()
        failed = response_object(self._ident, self._echo, status="failed", output=[], usage=usage,
                                 error={"code": body.get("code") or "server_error", "message": body["message"]})
        return b"".join((start, self._event("error", {"code": body.get("code"), "message": body["message"],
                                                      "param": body.get("param")}),
                         self._event("response.failed", {"response": failed})))
