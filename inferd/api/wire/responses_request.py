"""OpenAI's Responses API, request side: POST /v1/responses as typed structs, and what it asks for.

The structs are the single source of truth for what the route accepts (unknown fields are 400s naming
them; /openapi.json is generated from them). OpenAI parameters this server does not implement are
accepted only at their no-op value (`NO_OP_VALUES`), as /v1/chat/completions does. `prepare` turns a
request into a chat-kind `Prepared` (kind "responses": instructions as the system message, then the
input's messages); the stored conversation of `previous_response_id` goes between them
(inferd.api.pipeline.responses), since only the store knows it.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from inferd.api.errors import invalid
from inferd.api.wire.openai import (MAX_MESSAGES, NO_OP_VALUES as CHAT_NO_OP_VALUES, MetadataMap, PositiveInt,
                                    Prepared, Temperature, TopP)
from inferd.api.wire.strict import STRICT, is_no_op, show_value
from inferd.api.wire.responses_items import ResponseInputItem, input_messages, prompt_chars
from inferd.api.wire.responses_tools import prepare_response_tools
from inferd.api.wire.tools import FunctionName
from inferd.api.wire.structured import NAME_PATTERN, compact, set_guided
from inferd.types import GuidedDecoding

SchemaName = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]     # OpenAI's rule, as response_format's


class ResponseTextFormat(msgspec.Struct, **STRICT):
    """`text.format`: plain text, any JSON object, or JSON following `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: SchemaName | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseTextConfig(msgspec.Struct, **STRICT):
    format: ResponseTextFormat | None = None
    verbosity: str | None = None


class ResponseFunctionTool(msgspec.Struct, **STRICT):
    """A function tool in the Responses API's flat shape (chat nests the same fields under `function`)."""

    type: Literal["function"]
    name: FunctionName
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseToolChoiceFunction(msgspec.Struct, **STRICT):
    """tool_choice naming one function: {"type": "function", "name"}."""

    type: Literal["function"]
    name: str


class ResponseStreamOptions(msgspec.Struct, **STRICT):
    include_obfuscation: bool | None = None     # no-op value: false (we never add padding fields)


class ResponsesRequest(msgspec.Struct, **STRICT):
    """POST /v1/responses"""

    model: str
    input: str | Annotated[list[ResponseInputItem], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = None
    stream_options: ResponseStreamOptions | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: MetadataMap | None = None
    text: ResponseTextConfig | None = None
    user: str | None = None
    safety_identifier: str | None = None        # annotation only
    prompt_cache_key: str | None = None         # a routing hint; our prefix cache is automatic
    tools: list[ResponseFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponseToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's, accepted at their no-op value only (NO_OP_VALUES)
    background: bool | None = None
    include: list[str] | None = None
    max_tool_calls: int | None = None
    prompt: Any = None
    reasoning: Any = None
    service_tier: str | None = None
    truncation: str | None = None
    top_logprobs: int | None = None
    conversation: Any = None
    context_management: Any = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: Any = None
    moderation: Any = None
    image: Any = None
    access_programs: Any = None
    background_options: Any = None


NO_OP_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {
    "background": ((False,), "null or false"),
    "include": (([],), "null or []"),
    "max_tool_calls": ((), "null"),
    "prompt": ((), "null"),
    "reasoning": ((), "null"),
    "service_tier": CHAT_NO_OP_VALUES["service_tier"],
    "truncation": (("disabled",), "null or \"disabled\" (a conversation longer than the context is a 400)"),
    "top_logprobs": ((0,), "null or 0"),
    "conversation": ((), "null"),
    "context_management": ((), "null"),
    "prompt_cache_retention": CHAT_NO_OP_VALUES["prompt_cache_retention"],
    "prompt_cache_options": ((), "null"),
    "moderation": ((), "null"),
    "image": ((), "null"),
    "access_programs": ((), "null"),
    "background_options": ((), "null"),
}
_ID = re.compile(r"resp_[A-Za-z0-9]{1,64}")


def prepare(req: ResponsesRequest) -> tuple[Prepared, list[dict]]:
    """The request as a Prepared (kind "responses", messages: instructions then `input`) and `input`'s own
    messages (what a stored response keeps); 400s naming the field for what msgspec cannot express."""
    for name, (allowed, say) in NO_OP_VALUES.items():
        value = getattr(req, name)
        if not is_no_op(value, allowed):
            raise invalid(f"{name}: not supported by this server; only {say} is accepted (got {show_value(value)}).",
                          param=name, code="unsupported_parameter")
    if req.stream_options is not None:
        if not req.stream:
            raise invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          param="stream_options", code="invalid_value")
        if req.stream_options.include_obfuscation:
            raise invalid("stream_options.include_obfuscation: only false is accepted.",
                          param="stream_options.include_obfuscation", code="unsupported_parameter")
    if req.previous_response_id is not None and not _ID.fullmatch(req.previous_response_id):
        raise invalid(f"previous_response_id: not a response id (resp_...), got {show_value(req.previous_response_id)}.",
                      param="previous_response_id", code="invalid_value")
    inputs = input_messages(req.input)
    head = [{"role": "system", "content": req.instructions}] if req.instructions else []
    out = Prepared(kind="responses", messages=head + inputs, max_tokens=req.max_output_tokens,
                   stream=bool(req.stream), include_usage=True,      # the final event always carries usage
                   temperature=1.0 if req.temperature is None else req.temperature,
                   top_p=1.0 if req.top_p is None else req.top_p)
    out.prompt_chars = prompt_chars(out.messages)
    _prepare_format(req.text, out)
    prepare_response_tools(req, out)      # after text.format: a forced call replaces its grammar, as chat's
    return out, inputs


def _prepare_format(text: ResponseTextConfig | None, out: Prepared) -> None:
    """`text.format` -> the grammar the output follows (json_object, json_schema); `text` is no grammar."""
    fmt = text.format if text is not None else None
    if fmt is not None and fmt.type != "json_schema":
        for name in ("name", "schema", "strict", "description"):     # json_schema's own fields
            if getattr(fmt, name) is not None:
                raise invalid(f"text.format.{name}: not allowed with type {fmt.type!r}.", param=f"text.format.{name}",
                              code="unknown_parameter")
    if text is not None and text.verbosity not in (None, "medium"):
        raise invalid(f"text.verbosity: not supported by this server; only null or \"medium\" is accepted (got "
                      f"{show_value(text.verbosity)}).", param="text.verbosity", code="unsupported_parameter")
    if fmt is None or fmt.type == "text":
        return
    if fmt.type == "json_object":
        set_guided(out, GuidedDecoding(kind="json_object"), "text.format")
        return
    if fmt.name is None:
        raise invalid("text.format.name: required for a json_schema format.", param="text.format.name",
                      code="missing_required_parameter")
    if fmt.schema is None:
        raise invalid("text.format.schema: required for a json_schema format.", param="text.format.schema",
                      code="missing_required_parameter")
    # compact, keys in the client's order: the output's keys follow the schema's (inferd.api.wire.structured)
    set_guided(out, GuidedDecoding(kind="json_schema", spec=compact(fmt.schema)), "text.format")


def decoder() -> msgspec.json.Decoder:
    return msgspec.json.Decoder(ResponsesRequest)
