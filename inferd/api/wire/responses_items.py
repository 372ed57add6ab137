"""The Responses API's input items: messages ({role, content}, text parts only), the function calls a model
made and their outputs, passed back; and how any list of items (input, or a stored response's output)
becomes the chat messages the model's template renders."""
from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from inferd.api.errors import invalid
from inferd.api.wire.strict import STRICT
from inferd.api.wire.tools import FunctionName, check_name, template_arguments

TEXT_PART_TYPES = ("input_text", "output_text")


# fields a part may carry only as null: a text part carries its text alone (never dropped silently)
NON_TEXT_FIELDS = ("image_url", "file_id", "file_data", "filename", "file_url", "detail", "input_audio")

class ResponseInputPart(msgspec.Struct, **STRICT):
    """A part of an input message's content: text only (`input_text`; `output_text` in an assistant
    message the client passes back)."""

    type: str
    text: str | None = None
    annotations: list[Any] | None = None        # output_text's: passed back by clients, never read
    logprobs: list[Any] | None = None
    image_url: Any = None
    file_id: Any = None
    file_data: Any = None
    filename: Any = None
    file_url: Any = None
    detail: Any = None
    input_audio: Any = None                     # an audio part (the SDK's shape): refused as a part, by its index


class ResponseInputItem(msgspec.Struct, **STRICT):
    """An item of `input`: a message ({role, content}, `type` "message" or absent), as EasyInputMessage or
    an output message passed back (with its `id` and `status`); a function call the model made
    ({type: "function_call", call_id, name, arguments}), passed back; its result ({type:
    "function_call_output", call_id, output})."""

    type: Literal["message", "function_call", "function_call_output"] | None = None
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[ResponseInputPart] | None = None
    id: str | None = None
    status: str | None = None
    phase: str | None = None
    call_id: str | None = None
    name: FunctionName | None = None
    arguments: str | None = None
    output: str | list[ResponseInputPart] | None = None


def prompt_chars(messages: list[dict]) -> int:
    """How much text tokenization will see: the contents, and the calls' arguments."""
    return sum(len(m["content"]) + len(json.dumps(m["tool_calls"])) if "tool_calls" in m else len(m["content"])
               for m in messages)


def input_messages(value: str | list[ResponseInputItem]) -> list[dict]:
    """`input` as chat messages ({role, content}); "developer" is OpenAI's newer name for system."""
    if isinstance(value, str):
        if not value:
            raise invalid("input: must not be empty.", param="input", code="empty_prompt")
        return [{"role": "user", "content": value}]
    return item_messages([_item(item, f"input[{i}]") for i, item in enumerate(value)])


# each item type -> (its fields that must be there, the fields it may not have)
ITEM_FIELDS = {
    "message": (("role", "content"), ("call_id", "name", "arguments", "output")),
    "function_call": (("call_id", "name", "arguments"), ("role", "content", "output", "phase")),
    "function_call_output": (("call_id", "output"), ("role", "content", "name", "arguments", "phase")),
}


def _item(item: ResponseInputItem, where: str) -> dict:
    """One input item as the plain dict item_messages reads (the shape output items have), checked."""
    kind = item.type or "message"
    required, foreign = ITEM_FIELDS[kind]
    for name in required:
        if getattr(item, name) is None:
            raise invalid(f"{where}.{name}: required for a {kind} item.", param=f"{where}.{name}",
                          code="missing_required_parameter")
    for name in foreign:
        if getattr(item, name) is not None:
            raise invalid(f"{where}.{name}: not allowed in a {kind} item.", param=f"{where}.{name}",
                          code="unknown_parameter")
    if kind == "function_call":
        check_name(item.name, f"{where}.name")        # written into the prompt by the template
        return {"type": kind, "call_id": item.call_id, "name": item.name, "arguments": item.arguments}
    if kind == "function_call_output":
        output = item.output if isinstance(item.output, str) else _text_of(item.output, f"{where}.output")
        return {"type": kind, "call_id": item.call_id, "output": output}
    content = item.content if isinstance(item.content, str) else _text_of(item.content, f"{where}.content")
    return {"type": kind, "role": item.role, "content": content}


def item_messages(items: list[dict]) -> list[dict]:
    """Responses items (input items, or a response's output items) as chat messages for the template: a
    message's text; function calls as the `tool_calls` of the assistant message they follow (consecutive
    calls join one), arguments as objects where they parse (templates write them with `tojson`); a call's
    output as a `tool` message. "developer" is OpenAI's newer name for system."""
    messages: list[dict] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": template_arguments(item["arguments"])}}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        else:
            content = item["content"]
            if not isinstance(content, str):        # an output message: its output_text parts
                content = "".join(part.get("text", "") for part in content)
            messages.append({"role": "system" if item["role"] == "developer" else item["role"], "content": content})
    return messages


def _text_of(parts: list[ResponseInputPart], where: str) -> str:
    """The text of a list of parts at `where` (a message's `content`, a call output's `output`)."""
    texts = []
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        if part.type not in TEXT_PART_TYPES or part.text is None:
            raise invalid(f"{at}: only text parts (type \"input_text\" with a `text` string) are supported, got "
                          f"type {part.type!r}.", param=at, code="unsupported_parameter")
        for name in NON_TEXT_FIELDS:
            if getattr(part, name) is not None:
                raise invalid(f"{at}.{name}: not allowed in a text part.", param=f"{at}.{name}",
                              code="unsupported_parameter")
        texts.append(part.text)
    return "\n".join(texts)
