"""OpenAI's function tools on the request side: `tools`, `tool_choice`, `parallel_tool_calls`, and the
assistant `tool_calls` / `tool` messages of a conversation's history, as the chat template gets them.

`tool_choice` "required" and a named function constrain the output with a JSON schema built from the
tools', as vLLM does (vllm/tool_parsers/utils.py `_get_json_schema_from_tools`; before that
vllm/entrypoints/openai/protocol.py `_get_json_schema_from_tool`): a named function's output is its
`parameters` object; "required" is a JSON array of `{"name": <const>, "parameters": <its schema>}` items
(anyOf over the tools, at least one, at most one when parallel_tool_calls is false). "auto" leaves the
model free and its own tool-call format is parsed (inferd.api.wire.tool_calls).
"""
from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

import msgspec

from inferd.api.errors import invalid
from inferd.api.wire.json_depth import depth_exceeds
from inferd.api.wire.strict import STRICT
from inferd.types import GuidedDecoding

# The request, message and Prepared structs are inferd.api.wire.openai's, which imports this module: typed
# loosely here (Any) so the two do not import each other.

# OpenAI's rule for a function's name. msgspec's pattern is a re.search, and `$` matches before a trailing
# newline, so "foo\n" would pass it: names are checked again whole (check_name), as they go into the prompt.
FunctionName = Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# Every tool is rendered into the prompt and, for "required", into one grammar: a bound on both.
MAX_TOOLS = 128


class FunctionDefinition(msgspec.Struct, **STRICT):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None    # a JSON schema of an object; absent: no parameters
    strict: bool | None = None                  # our calls always follow the schema under required/named


class Tool(msgspec.Struct, **STRICT):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(msgspec.Struct, **STRICT):
    name: str


class NamedToolChoice(msgspec.Struct, **STRICT):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(msgspec.Struct, **STRICT):
    name: FunctionName
    arguments: str                              # JSON text, as the model wrote it


class MessageToolCall(msgspec.Struct, **STRICT):
    """A call in an assistant message of the history."""

    id: str
    type: Literal["function"]
    function: CalledFunction


def prepare_tools(req: Any, out: Any) -> None:
    """Fill out.tools / tool_choice / tool_name / parallel_tool_calls, and the grammar of required/named."""
    tools = req.tools or []
    if len(tools) > MAX_TOOLS:
        raise invalid(f"tools: at most {MAX_TOOLS} tools, got {len(tools)}.", param="tools", code="invalid_value")
    names = [t.function.name for t in tools]
    for i, t in enumerate(tools):
        check_name(t.function.name, f"tools[{i}].function.name")
        schema = t.function.parameters
        if schema is not None and schema.get("type", "object") != "object":
            raise invalid(f"tools[{i}].function.parameters: must be a JSON schema of an object.",
                          param=f"tools[{i}].function.parameters", code="invalid_value")
        if schema is not None and not isinstance(schema.get("$defs", {}), dict):
            raise invalid(f"tools[{i}].function.parameters.$defs: must be an object of named schemas.",
                          param=f"tools[{i}].function.parameters.$defs", code="invalid_value")
    choice = req.tool_choice
    if choice is not None and choice != "none" and not tools:
        raise invalid("tool_choice: only allowed when tools are specified.", param="tool_choice",
                      code="invalid_value")
    out.parallel_tool_calls = req.parallel_tool_calls is not False
    if not tools:
        return
    out.tools = [msgspec.to_builtins(t) for t in tools]
    out.prompt_chars += len(json.dumps(out.tools))      # the template renders them into the prompt
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise invalid(f"tool_choice: no tool named {choice.function.name!r} in tools.",
                          param="tool_choice", code="invalid_value")
        out.tool_choice, out.tool_name = "function", choice.function.name
        _guide(out, _parameters(tools[names.index(choice.function.name)]))
    elif choice == "required":
        out.tool_choice = "required"
        _guide(out, required_schema(tools, out.parallel_tool_calls))
    else:
        out.tool_choice = choice or "auto"      # OpenAI's default when tools are given


def check_name(name: str, where: str) -> None:
    """A function's name, whole: OpenAI's characters only (it is written into the prompt)."""
    if not _NAME.fullmatch(name):
        raise invalid(f"{where}: must be 1 to 64 letters, digits, underscores or dashes.", param=where,
                      code="invalid_value")


def _parameters(tool: Tool) -> dict:
    return tool.function.parameters or {"type": "object", "properties": {}}


def required_schema(tools: list[Tool], parallel: bool) -> dict:
    """vLLM's schema for tool_choice "required", with the tools' `$defs` hoisted to the top (where their
    `$ref`s point once the schemas are nested)."""
    defs: dict[str, Any] = {}
    items = []
    for i, t in enumerate(tools):
        params = dict(_parameters(t))
        for name, schema in params.pop("$defs", {}).items():
            if defs.setdefault(name, schema) != schema:
                raise invalid(f"tools[{i}].function.parameters.$defs.{name}: another tool defines it differently; "
                              "tool_choice \"required\" needs one definition per name.",
                              param="tool_choice", code="invalid_value")
        items.append({"properties": {"name": {"type": "string", "enum": [t.function.name]}, "parameters": params},
                      "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _guide(out: Any, schema: dict) -> None:
    """The calls' grammar (compact, keys in the client's order: the output's keys follow the order of a schema's
    properties). It replaces a response_format's: under "required" or a named function the whole output is
    calls, and response_format shapes a text answer, of which there is none (as OpenAI's API: a forced call is a
    call whatever response_format says)."""
    out.guided = GuidedDecoding(kind="json_schema", spec=msgspec.json.encode(schema).decode())
    out.guided_param = "tool_choice"


def tool_message_fields(m: Any, where: str, msg: dict) -> None:
    """An assistant message's `tool_calls` and a tool message's `tool_call_id`, into the template's message
    `msg`. Arguments that parse are given as objects (templates write them with `tojson`), as transformers
    and vLLM do."""
    if m.tool_call_id is not None and m.role != "tool":
        raise invalid(f"{where}.tool_call_id: only allowed in a tool message.", param=f"{where}.tool_call_id",
                      code="invalid_value")
    if m.role == "tool" and m.tool_call_id is None:
        raise invalid(f"{where}.tool_call_id: required for role 'tool'.", param=f"{where}.tool_call_id",
                      code="missing_required_parameter")
    if m.tool_call_id is not None:
        msg["tool_call_id"] = m.tool_call_id
    if not m.tool_calls:
        return
    if m.role != "assistant":
        raise invalid(f"{where}.tool_calls: only allowed in an assistant message.", param=f"{where}.tool_calls",
                      code="invalid_value")
    for j, c in enumerate(m.tool_calls):
        check_name(c.function.name, f"{where}.tool_calls[{j}].function.name")
    msg["tool_calls"] = [{"id": c.id, "type": "function",
                          "function": {"name": c.function.name, "arguments": template_arguments(c.function.arguments)}}
                         for c in m.tool_calls]


def template_arguments(text: str) -> Any:
    """A call's `arguments` as chat templates take them: the object when the JSON text is one (as
    transformers and vLLM pass them), else the text as it came: so too for JSON nested past the bound every
    body keeps (a template's `tojson` would recurse through it)."""
    if depth_exceeds(text.encode()):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text
