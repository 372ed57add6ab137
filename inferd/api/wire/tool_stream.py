"""Chat responses of requests with tools in play: the output parsed into `tool_calls`, streamed as OpenAI streams
them, or whole in the message.

Streamed (as OpenAI's API and vLLM): a call's first chunk is `delta.tool_calls: [{index, id, type: "function",
function: {name, arguments: ""}}]`, its arguments follow in `delta.tool_calls: [{index, function: {arguments}}]`
pieces as the model writes them, and the last chunk has an empty delta and `finish_reason: "tool_calls"` when
the output made a call (a `max_tokens` cut says "length"). Content around the calls streams as `delta.content`.
The parser sees the text after the output filter (inferd.api.pipeline.safety), which scanned it raw, arguments
included; usage counts every token whatever became of its text.
"""
from __future__ import annotations

from collections.abc import Callable

import orjson

from inferd.api.wire.logprobs import LogprobFormat
from inferd.api.wire.responses import ChunkEncoder
from inferd.api.wire.tool_calls import (ArgumentsPiece, CallStarted, HermesParser, Llama3JsonParser, TextPiece,
                                        ToolCallParser, ToolEvent)


def finish_with_calls(finish: str, parser: ToolCallParser) -> str:
    """OpenAI's finish_reason: "tool_calls" for an output that ended by itself after making calls."""
    return "tool_calls" if finish == "stop" and parser.calls else finish


def tool_message(parser: ToolCallParser, text: str) -> tuple[str | None, list[dict] | None]:
    """A whole output's (content, tool_calls): content None when all of it was calls, as OpenAI's."""
    events = parser.feed(text) + parser.close()
    content = "".join(e.text for e in events if isinstance(e, TextPiece))
    if not parser.calls:
        return content, None
    if isinstance(parser, (HermesParser, Llama3JsonParser)) and not all(_parses(c.arguments) for c in parser.calls):
        # tool_choice auto, a call cut short (max_tokens, or the model stopped inside it): the whole output is
        # content, as vLLM's parsers return it, never arguments a client's json.loads fails on (nor finish_reason "tool_calls")
        parser.calls.clear()
        return text, None
    calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in parser.calls]
    return (content if content.strip() else None), calls


def _parses(arguments: str) -> bool:
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return False
    return True


def _deltas(events: list[ToolEvent]) -> list[dict]:
    """One delta per run of events: text pieces joined, a call's arguments pieces joined."""
    out: list[dict] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, TextPiece):
            if last is not None and "content" in last:
                last["content"] += e.text
            else:
                out.append({"content": e.text})
        elif isinstance(e, CallStarted):
            out.append({"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                        "function": {"name": e.name, "arguments": ""}}]})
        elif isinstance(e, ArgumentsPiece):
            calls = last.get("tool_calls") if last is not None else None
            if calls and calls[0]["index"] == e.index:
                calls[0]["function"]["arguments"] += e.text
            else:
                out.append({"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]})
    return out


class ToolChunkEncoder(ChunkEncoder):
    """ChunkEncoder for chat requests with tools in play: each choice's text goes through its ToolCallParser and
    the events become chunks; logprobs (when asked) ride on the first chunk after their tokens. A chunk whose text
    is held back (it may be the start of a call) is no frame at all: b""."""

    __slots__ = ("_make_parser", "_parser", "_formats", "_first", "_head")

    def __init__(self, make_parser: Callable[[], ToolCallParser], ident, include_usage: bool, *, index: int = 0,
                 formats: list[LogprobFormat] | None = None, **kw) -> None:
        super().__init__(ident, include_usage, index=index, **kw)
        self._make_parser = make_parser
        self._parser = make_parser()
        self._formats = formats
        self._first = True
        self._head = b"data: " + orjson.dumps(ident.header(self._object))[:-1] + b',"choices":[{"index":%d,' % index

    def for_choice(self, index: int) -> ToolChunkEncoder:
        return ToolChunkEncoder(self._make_parser, self._ident, self._include_usage, index=index,
                                formats=self._formats, running=self.running, usage_comment=self._usage_comment,
                                hold_done=self.hold_done, timeline=self.timeline)

    def _frame(self, delta: dict, finish: str | None, usage: bytes | None) -> bytes:
        if self._first:                 # the first chunk announces the role, as OpenAI's does
            delta = {"role": "assistant", **delta}
            self._first = False
        fmt = self._formats[self._index] if self._formats is not None else None
        lp = fmt.take() if fmt is not None else None
        tail = self._tail if usage is None else b'}],"usage":' + usage + b"}\n\n"
        return b"".join((self._head, b'"delta":', orjson.dumps(delta), b',"logprobs":', orjson.dumps(lp),
                         b',"finish_reason":', orjson.dumps(finish), tail))

    def _frames(self, events: list[ToolEvent], tokens: int, finish: str | None = None) -> bytes:
        deltas = _deltas(events)
        if finish is not None:
            deltas.append({})
        if not deltas:
            if self.running is not None:
                self.running.count(tokens)
            return b""
        last = len(deltas) - 1
        running = self.running          # set: every chunk carries the usage so far, the last one all `tokens`
        before = running.add(0) if running is not None and last else None
        usage = running.add(tokens) if running is not None else None
        return b"".join(self._frame(d, finish if i == last else None, usage if i == last else before)
                        for i, d in enumerate(deltas))

    def content(self, text: str) -> bytes:
        return self._frames(self._parser.feed(text), 0)

    def content_with_usage(self, text: str, tokens: int) -> bytes:
        return self._frames(self._parser.feed(text), tokens)

    def final(self, text: str, finish: str, tokens: int = 0) -> bytes:
        events = self._parser.feed(text) + self._parser.close()
        return self._frames(events, tokens, finish_with_calls(finish, self._parser))
