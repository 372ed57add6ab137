"""Tool-call parsing's parts: the events a parser emits, the calls it keeps, and the scanner of call objects in
a row that streams each call's arguments as the model writes them (the formats are inferd.api.wire.tool_calls)."""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass


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
# A header is matched from its start again on every feed until it is whole: one longer than this (a name runs
# on, whitespace floods) is no streamable call, so it is parsed whole at its end instead, and a runaway model
# costs linear time, not a rescan per token (names are at most 64 characters).
MAX_HEADER = 1024


class JsonValueEnd:
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
        except (ValueError, RecursionError):      # the model's text need not be JSON, nor shallow
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


class CallScanner:
    """Call objects in a row (`{"name": ..., "arguments": VALUE}` with separators between), streaming each
    call's arguments as they come. `buf` holds what is not yet consumed."""

    def __init__(self, owner: ToolCallParser, separators: str) -> None:
        self.owner = owner
        self.separators = separators
        self.buf = ""
        self.raw = ""                   # everything fed
        self.state = "between"          # between | header | value | after
        self.index = -1
        self.value = JsonValueEnd()
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
                    self.failed = len(self.buf) > MAX_HEADER
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
                self.value, self.state = JsonValueEnd(), "value"
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
