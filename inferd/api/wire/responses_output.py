"""OpenAI's Responses API, response side: the Response object and its output items (a `message` with
`output_text`, `function_call`s), whole; its stream of typed events is inferd.api.wire.responses_events.
"""
from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

import msgspec

from inferd.api.wire.responses import Identity
from inferd.types import Usage

if TYPE_CHECKING:
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
            "text": text, "tool_choice": msgspec.to_builtins(req.tool_choice) if req.tool_choice is not None else "auto",
            "tools": msgspec.to_builtins(req.tools or []),
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


def call_item(call_id: str, name: str, arguments: str, status: str) -> dict:
    """A function_call output item: `call_id` is what the client's function_call_output names."""
    return {"id": "fc_" + secrets.token_hex(12), "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(pieces: list[Any], status: str) -> list[dict]:
    """A whole output's items from its pieces (str: text; else a tool call parser's event, see `kind_of`), in
    the order the stream adds them (inferd.api.wire.responses_events): each run of text one message, each call
    one function_call item (blank text beside calls is no message: the parsers hold it back from the stream);
    an output with nothing in it, one empty message."""
    blank_ok = not any(kind_of(p) == "call" for p in pieces)
    items: list[dict] = []
    calls: dict[int, dict] = {}
    text: list[str] = []

    def end_message() -> None:
        if text and (blank_ok or "".join(text).strip()):
            items.append(message_item(new_item_id(), "".join(text), status))
        text.clear()
    for p in pieces:
        kind = kind_of(p)
        if kind == "text":
            piece = p if isinstance(p, str) else p.text
            if piece:
                text.append(piece)
        elif kind == "call":
            end_message()
            calls[p.index] = call_item(p.id, p.name, "", status)
            items.append(calls[p.index])
        else:
            calls[p.index]["arguments"] += p.text
    end_message()
    return items or [message_item(new_item_id(), "", status)]


def kind_of(piece: Any) -> str:
    """"text", "call" or "arguments": a string, or a tool call parser's event (inferd.api.wire.tool_calls:
    TextPiece has a text, CallStarted an index and a name, ArgumentsPiece an index and a text)."""
    if isinstance(piece, str) or not hasattr(piece, "index"):
        return "text"
    return "call" if hasattr(piece, "name") else "arguments"


def finished_response(ident: Identity, echo: dict, items: list[dict], finish: str, usage: Usage | None) -> dict:
    """The whole Response of a generation that ended with OpenAI finish_reason `finish`."""
    status, reason = STATUS[finish]
    return response_object(ident, echo, status=status, output=items, usage=usage, incomplete=reason)
