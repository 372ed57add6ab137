"""Tool calls out of a model's output text, incrementally: one small parser per format.

- "hermes" (ChatML models, Qwen2.5's format; the synthetic models): calls are
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` anywhere in the output, text around them is content.
- "llama3_json" (Llama 3.x checkpoints): an output that starts with `{` (after an optional `<|python_tag|>`)
  is one or more `{"name": ..., "parameters": {...}}` objects separated by `;`; any other output is content.
- tool_choice "required": the grammar's JSON, `[{"name": ..., "parameters": {...}}, ...]` (as vLLM);
  a named function: the grammar's JSON is that function's arguments, nothing else (as vLLM).

Each parser turns text into events as it arrives: TextPiece (content), CallStarted (a call's id and name,
once its name is known) and ArgumentsPiece (more of its arguments' JSON text, streamed as the model writes
them). Text that could still turn into a call (a partial `<tool_call>`, whitespace between calls) is held
back until it cannot. A call whose JSON does not have the expected shape in order (`name` first) is
parsed whole once it ends; one that does not parse at all is content, as vLLM's parsers keep it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from inferd.api.wire.tool_events import (
    ArgumentsPiece,
    CallScanner,
    CallStarted,
    TextPiece,
    ToolCall,
    ToolCallParser,
    ToolEvent,
)

if TYPE_CHECKING:   # only its tool_choice/tool_name/tools are read
    from inferd.api.wire.openai import Prepared

__all__ = ["FORMATS", "ArgumentsPiece", "CallStarted", "FirstCallOnly", "HermesParser", "Llama3JsonParser", "NamedParser",
           "RequiredParser", "TextPiece", "ToolCall", "ToolCallParser", "ToolEvent", "parser_for"]
FORMATS = ("hermes", "llama3_json")


class HermesParser(ToolCallParser):
    """`<tool_call>{json}</tool_call>` blocks; the text around them is content (whitespace between calls is not)."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._text = ""                 # content not yet released
        self._segment: CallScanner | None = None     # inside a <tool_call> block
        self._pending = ""              # inside a block: text that may be the start of </tool_call>

    def feed(self, text: str) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        while text:
            if self._segment is None:
                text = self._outside(text, out)
            else:
                text = self._inside(text, out)
        return out

    def _outside(self, text: str, out: list[ToolEvent]) -> str:
        buf = self._text + text
        at = buf.find(self.OPEN)
        if at >= 0:
            self._release(buf[:at], out, final=True)
            self._text, self._segment, self._pending = "", CallScanner(self, " \t\r\n"), ""
            return buf[at + len(self.OPEN):]
        keep = _partial_suffix(buf, self.OPEN)
        self._text = buf[len(buf) - keep:] if keep else ""
        self._release(buf[:len(buf) - keep], out, final=False)
        return ""

    def _release(self, text: str, out: list[ToolEvent], final: bool) -> None:
        """Content, but trailing whitespace is held until more text comes (it is dropped before a call), so
        the events do not depend on how the text was split."""
        body = text.rstrip()
        if body:
            out.append(TextPiece(body))
        if not final and len(body) < len(text):
            self._text = text[len(body):] + self._text

    def _inside(self, text: str, out: list[ToolEvent]) -> str:
        buf = self._pending + text
        at = buf.find(self.CLOSE)
        segment = self._segment
        if at >= 0:
            segment.feed(buf[:at], out)
            if not segment.end(out):
                out.append(TextPiece(self.OPEN + segment.raw + self.CLOSE))
            self._segment, self._pending = None, ""
            return buf[at + len(self.CLOSE):]
        keep = _partial_suffix(buf, self.CLOSE)
        self._pending = buf[len(buf) - keep:] if keep else ""
        segment.feed(buf[:len(buf) - keep], out)
        return ""

    def close(self) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        segment = self._segment
        if segment is not None:         # cut short inside a block (max_tokens): what there is
            segment.feed(self._pending, out)
            if not segment.end(out):
                out.append(TextPiece(self.OPEN + segment.raw))
            self._segment = None
        elif self._text and (self._text.strip() or not self.calls):
            out.append(TextPiece(self._text))
        self._text = self._pending = ""
        return out


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker` (it may yet become one)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class _JsonCalls(ToolCallParser):
    """Output that is calls from its first character (after `lead`) or not at all: Llama 3.x's JSON, and the
    grammar's array for tool_choice "required"."""

    def __init__(self, lead: str, separators: str) -> None:
        super().__init__()
        self._lead = lead               # an opening the model may write first (Llama's <|python_tag|>)
        self._head = ""                 # text before deciding
        self._calls: CallScanner | None = None
        self._content = False           # decided: not calls
        self._separators = separators

    def feed(self, text: str) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        if self._content:
            return [TextPiece(text)] if text else []
        if self._calls is not None:
            self._calls.feed(text, out)
            return out
        head = self._head + text
        body = head.lstrip()
        if self._lead and body.startswith(self._lead):
            body = body[len(self._lead):].lstrip()
        elif self._lead and self._lead.startswith(body):
            self._head = head           # may be the lead: wait
            return out
        if not body:
            self._head = head
            return out
        self._head = ""
        if body[0] in "{[":
            self._calls = CallScanner(self, self._separators)
            self._calls.feed(body, out)
        else:
            self._content = True
            out.append(TextPiece(head))
        return out

    def close(self) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        if self._calls is not None and not self._calls.end(out):
            out.append(TextPiece(self._calls.raw))      # JSON, but not calls: content, as vLLM
        elif self._calls is None and self._head:
            out.append(TextPiece(self._head))
        self._calls, self._head = None, ""
        return out


class Llama3JsonParser(_JsonCalls):
    def __init__(self) -> None:
        super().__init__("<|python_tag|>", " \t\r\n;")


class RequiredParser(_JsonCalls):
    """tool_choice "required": the grammar's `[{"name": ..., "parameters": {...}}, ...]`."""

    def __init__(self) -> None:
        super().__init__("", " \t\r\n,[]")


class NamedParser(ToolCallParser):
    """tool_choice naming a function: the whole output is its arguments."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def feed(self, text: str) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        if not self.calls:
            self._start(self._name, out)
        self._arguments(0, text, out)
        return out

    def close(self) -> list[ToolEvent]:
        return self.feed("") if not self.calls else []


_AUTO = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}


def parser_for(prepared: Prepared, tool_format: str) -> ToolCallParser | None:
    """The parser of one choice's output (None: the request has no tools in play). "auto" parses the model's
    own format (`tool_format`, from its artifact's manifest); "required" and a named function parse the
    grammar's JSON, whatever the model's format."""
    choice = prepared.tool_choice
    if choice == "none" or not prepared.tools:
        return None
    if choice == "function":
        return NamedParser(prepared.tool_name or "")
    if choice == "required":
        return RequiredParser()             # its grammar already allows one call when parallel_tool_calls is false
    parser = _AUTO.get(tool_format, HermesParser)()
    return parser if prepared.parallel_tool_calls else FirstCallOnly(parser)


class FirstCallOnly(ToolCallParser):
    """parallel_tool_calls false under "auto": the model is free and may write several calls; only the first is
    kept, the others dropped (their text is not content either), as vLLM does
    (vllm/entrypoints/serve/utils/tool_calls_utils.py `maybe_filter_parallel_tool_calls`)."""

    def __init__(self, inner: ToolCallParser) -> None:     # no super().__init__: `calls` is the inner's
        self._inner = inner

    @property
    def calls(self) -> list[ToolCall]:          # type: ignore[override]
        return self._inner.calls[:1]

    def feed(self, text: str) -> list[ToolEvent]:
        return _first_call_only(self._inner.feed(text))

    def close(self) -> list[ToolEvent]:
        return _first_call_only(self._inner.close())


def _first_call_only(events: list[ToolEvent]) -> list[ToolEvent]:
    return [e for e in events if not isinstance(e, (CallStarted, ArgumentsPiece)) or e.index == 0]
