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

import json
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # only its tool_choice/tool_name are read
    from inferd.api.wire.openai import Prepared

FORMATS = ("hermes", "llama3_json")


@dataclass(frozen=True, slots=True)
class TextPiece:
    text: str                       # ordinary content


@dataclass(frozen=True, slots=True)
class CallStarted:
    index: int
    id: str                         # "call_..."
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsPiece:
    index: int
    text: str                       # more of call `index`'s arguments (JSON text)


ToolEvent = TextPiece | CallStarted | ArgumentsPiece


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str                  # JSON text (whole once the call is complete)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


# `{"name": "<name>", "arguments": ` (or "parameters"), the part of a call before its arguments' value.
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class _Value:
    """Where a JSON value ends, fed a character at a time (strings and nesting respected)."""

    __slots__ = ("depth", "in_string", "escape", "started")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = self.escape = self.started = False

    def step(self, c: str) -> bool:
        """Take `c` (part of the value); True when it closed the value."""
        self.started = True
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
            return False
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return self.depth <= 0
        return False


class ToolCallParser:
    """Base: the calls so far and their events. `feed` text as it comes, then `close` once at the end."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []     # started calls; each call's arguments are whole once it ended

    def feed(self, text: str) -> list[ToolEvent]:
        raise NotImplementedError

    def close(self) -> list[ToolEvent]:
        return []

    def _start(self, name: str, out: list[ToolEvent]) -> int:
        index = len(self.calls)
        call = ToolCall(new_call_id(), name, "")
        self.calls.append(call)
        out.append(CallStarted(index, call.id, name))
        return index

    def _arguments(self, index: int, text: str, out: list[ToolEvent]) -> None:
        if text:
            self.calls[index].arguments += text
            out.append(ArgumentsPiece(index, text))

    def _whole(self, raw: str, out: list[ToolEvent]) -> bool:
        """A call (or a list of them) parsed whole; False when `raw` is not one."""
        try:
            value = json.loads(raw)
        except ValueError:
            return False
        items = value if isinstance(value, list) else [value]
        if not items or not all(_is_call(v) for v in items):
            return False
        for v in items:
            args = v.get("arguments", v.get("parameters"))
            self._arguments(self._start(v["name"], out), args if isinstance(args, str) else
                            json.dumps(args, ensure_ascii=False), out)
        return True


def _is_call(v: object) -> bool:
    return isinstance(v, dict) and isinstance(v.get("name"), str) and (
        isinstance(v.get("arguments"), (dict, str)) or isinstance(v.get("parameters"), dict))


class _Calls:
    """Call objects in a row (`{"name": ..., "arguments": VALUE}` with separators between), streaming each
    call's arguments as they come. `buf` holds what is not yet consumed."""

    def __init__(self, owner: ToolCallParser, separators: str) -> None:
        self.owner = owner
        self.separators = separators
        self.buf = ""
        self.raw = ""                   # everything fed
        self.state = "between"          # between | header | value | after
        self.index = -1
        self.value = _Value()
        self.failed = False             # a call without the expected shape: parsed whole at the end
        self.started = 0                # calls this segment started

    def feed(self, text: str, out: list[ToolEvent]) -> None:
        self.raw += text
        self.buf += text
        while self.buf and not self.failed:
            if self.state == "between":
                stripped = self.buf.lstrip(self.separators)
                if not stripped:
                    self.buf = ""
                    return
                self.buf = stripped
                if stripped[0] != "{":
                    self.failed = True
                    return
                self.state = "header"
            elif self.state == "header":
                m = _HEADER.match(self.buf)
                if m is None or m.end() == len(self.buf):   # need more (or it never fits: parsed whole)
                    return
                if self.buf[m.end()] != "{":     # arguments as a JSON string, say: parsed whole at the end
                    self.failed = True
                    return
                try:
                    name = json.loads('"' + m.group(1) + '"')
                except ValueError:
                    self.failed = True
                    return
                self.index = self.owner._start(name, out)
                self.started += 1
                self.buf = self.buf[m.end():]
                self.value, self.state = _Value(), "value"
            elif self.state == "value":
                self._value(out)
            else:   # after the arguments: the call object's closing brace
                stripped = self.buf.lstrip()
                if not stripped:
                    self.buf = ""
                    return
                if stripped[0] != "}":
                    self.failed = True
                    return
                self.buf, self.state = stripped[1:], "between"

    def _value(self, out: list[ToolEvent]) -> None:
        value, buf = self.value, self.buf
        for i, c in enumerate(buf):
            if value.step(c):
                self.owner._arguments(self.index, buf[:i + 1], out)
                self.buf, self.state = buf[i + 1:], "after"
                return
        self.owner._arguments(self.index, buf, out)
        self.buf = ""

    def end(self, out: list[ToolEvent]) -> bool:
        """The segment is over: True when it was calls (streamed, or parsed whole now), False when it was not
        one (its raw text is content)."""
        if self.started:
            return True
        return self.owner._whole(self.raw, out)


class HermesParser(ToolCallParser):
    """`<tool_call>{json}</tool_call>` blocks; the text around them is content (whitespace between calls is not)."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._text = ""                 # content not yet released
        self._segment: _Calls | None = None     # inside a <tool_call> block
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
            self._text, self._segment, self._pending = "", _Calls(self, " \t\r\n"), ""
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
        self._calls: _Calls | None = None
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
            self._calls = _Calls(self, self._separators)
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
        return RequiredParser()
    return _AUTO.get(tool_format, HermesParser)()
