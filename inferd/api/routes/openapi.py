"""The OpenAPI 3.1 document, with request schemas generated from the structs the decoder uses.

Because /v1/completions and /v1/chat/completions decode with exactly these msgspec structs
(unknown fields rejected), the document cannot drift from what the server accepts. The rules
`prepare` checks after decoding (no-op-only parameters, non-empty prompts and stop strings, chat
roles and content, `stream_options` only with `stream`) are added to the generated schemas here,
so a request the schema allows is one validation accepts, and a client generated from this
document (or a fuzzer such as schemathesis) is not surprised by a 400. What no JSON
Schema can say is left to the documented 400/404: what depends on the model (the prompt's length
against its context, token ids against its vocabulary, what its chat template accepts), model
names the server does not serve, and an integer spelled as a float (`2.0`, the same number to JSON
Schema, is refused where the struct says int).
"""
from __future__ import annotations

import functools
import typing

import msgspec
import orjson

from inferd import __version__
from inferd.api.wire.admin_requests import AdapterAction
from inferd.api.wire.openai import (
    MAX_PROMPTS,
    MAX_STOP_CHARS,
    NO_OP_VALUES,
    OTHER_PART_FIELDS,
    UNSUPPORTED_MESSAGE_FIELDS,
    UNSUPPORTED_ROLES,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)
from inferd.api.wire.embedding_format import MAX_INPUTS, EmbeddingRequest
from inferd.api.wire.tools import MAX_TOOLS
from inferd.api.wire.sampling import LOGIT_BIAS_KEY
from inferd.engine import LOGIT_BIAS_RANGE, MAX_LOGIT_BIAS
from inferd.api.routes.openapi_batches import batch_paths
from inferd.api.routes.openapi_responses import responses_paths
from inferd.api.routes.openapi_structured import tighten_structured
from inferd.api.routes.openapi_tokenization import tokenization_paths

_REF = "#/components/schemas/{name}"

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}

_ERROR_TEXT = {
    "400": "Invalid request: the message and `param` name the field",
    "401": "Missing or unknown API key (when auth is on)",
    "403": "The key lacks the scope, or its tenant may not use the model",
    "404": "Not found: the message and `code` say what",
    "409": "The rollout cannot take this action in its current state",
    "413": "Body larger than server.max_body_bytes",
    "415": "Content-Type is not application/json",
    "422": "The adapter's files could not be loaded: the message names the file and the tensor",
    "429": "Tenant over quota, its queue full, or its refused requests paced (Retry-After)",
    "500": "Server error (never caused by the request's content)",
    "503": "Draining, overloaded, engine unavailable, or its model cannot be loaded now (Retry-After)",
    "504": "The request's deadline passed before it could start",
}
_GENERATE_ERRORS = ("400", "401", "403", "404", "413", "415", "429", "500", "503", "504")

# The chat roles `prepare` accepts: the struct's, less those it refuses.
CHAT_ROLES = tuple(r for r in typing.get_args(typing.get_type_hints(ChatMessage)["role"])
                   if r not in UNSUPPORTED_ROLES)
# inferd.api.admin.rollouts.control_rollout's actions; any other is a 404 unknown_action.
ROLLOUT_ACTIONS = ("start", "pause", "resume", "promote", "rollback")
# What routing (inferd.models.routing: resolve, split_adapter; ModelVersion.parse) accepts as `model` before
# it looks the name up: not blank; `name`, `name@version` or either with `:adapter` (adapter not blank).
# Anything else is a 400 invalid_model; a well-formed name the server does not serve is a 404.
MODEL_PATTERN = (r"^(?:(?=[\s\S]*\S)(?:[^:@]*|[^:@]+@[^:@]+)"
                 r"|(?:[^:@]+|[^:@]+@[^:@]+):[\s\S]*\S[\s\S]*)$")


def _no_op(values: tuple, say: str) -> dict:
    """A parameter accepted only at its no-op value; null always counts as absent."""
    return {"enum": [None, *values], "default": None, "description": f"Not implemented by this server: accepted only as {say}."}


# vLLM's extensions to OpenAI's sampling (docs/api.md says which engines honour each).
_EXTENSIONS = {
    "top_k": "vLLM's: sample from the k most likely tokens; -1 or 0: no limit.",
    "min_p": "vLLM's: drop tokens less likely than min_p times the most likely one; 0: none.",
    "repetition_penalty": "vLLM's: logits of prompt and output tokens, divided by it when positive and "
                          "multiplied when negative; 1: none.",
}


def _tighten_sampling(schema: dict, kind: str) -> None:
    props = schema["properties"]
    props["model"] = {"type": "string", "pattern": MODEL_PATTERN}
    for name, (values, say) in NO_OP_VALUES.items():
        if name in props:
            props[name] = _no_op(values, say)
    # Token ids, canonically spelled, to a bias; whether an id is in the model's vocabulary is a documented 400.
    bias = {"type": "object", "propertyNames": {"pattern": LOGIT_BIAS_KEY}, "maxProperties": MAX_LOGIT_BIAS,
            "additionalProperties": {"type": "number", "minimum": LOGIT_BIAS_RANGE[0], "maximum": LOGIT_BIAS_RANGE[1]}}
    props["logit_bias"] = {"anyOf": [bias, {"type": "null"}], "default": None}
    for name, say in _EXTENSIONS.items():
        props[name] = {**props[name], "description": say}
    stop = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
    props["stop"] = {"anyOf": [stop, {"type": "array", "items": stop, "maxItems": 4}, {"type": "null"}],
                     "default": None}
    # As OpenAI: stream_options for a response that is not a stream would be silently ignored, so it is a 400.
    schema["anyOf"] = [{"properties": {"stream": {"const": True}}, "required": ["stream"]},
                       {"properties": {"stream_options": {"type": "null"}}}]
    if kind == "chat":      # as OpenAI: top_logprobs only with logprobs true
        schema["allOf"] = [{"anyOf": [{"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
                                      {"properties": {"top_logprobs": {"type": "null"}}}]}]


def _prompt_schema() -> dict:
    """A non-empty string, token ids, or a batch of up to MAX_PROMPTS non-empty strings or token-id lists."""
    token_ids = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
    text = {"type": "string", "minLength": 1}
    return {"anyOf": [
        text,
        token_ids,
        {"type": "array", "items": text, "minItems": 1, "maxItems": MAX_PROMPTS},
        {"type": "array", "items": token_ids, "minItems": 1, "maxItems": MAX_PROMPTS},
    ]}


def _chat_message_schema(generated: dict) -> dict:
    """Roles without tool/function; content required except from the assistant; unsupported fields null."""
    props = dict(generated["properties"])
    for name in UNSUPPORTED_MESSAGE_FIELDS:
        # `prepare` lets an empty list through too, where the field's type allows one
        types = generated["properties"][name].get("anyOf")       # none: typed Any
        can_be_list = types is None or any(t.get("type") == "array" for t in types)
        props[name] = {"enum": [None, []] if can_be_list else [None], "default": None}
    content = props.pop("content")["anyOf"]
    content = [c for c in content if c != {"type": "null"}]
    base = {k: v for k, v in generated.items() if k not in ("properties", "required")}
    # tool_calls only from the assistant, tool_call_id only (and always) in a tool message
    no_calls = {"tool_calls": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}], "default": None},
                "tool_call_id": {"type": "null", "default": None}}
    assistant = {**base, "properties": {**props, "role": {"const": "assistant"},
                                        "content": {"anyOf": [*content, {"type": "null"}], "default": None},
                                        "tool_call_id": no_calls["tool_call_id"]},
                 "required": ["role"]}
    others = {**base, "properties": {**props, **no_calls,
                                     "role": {"enum": [r for r in CHAT_ROLES if r not in ("assistant", "tool")]},
                                     "content": {"anyOf": content}},
              "required": ["role", "content"]}
    tool = {**base, "properties": {**props, "tool_calls": no_calls["tool_calls"], "role": {"const": "tool"},
                                   "content": {"anyOf": content}, "tool_call_id": {"type": "string"}},
            "required": ["role", "content", "tool_call_id"]}
    return {"title": generated["title"], "anyOf": [others, assistant, tool]}


def _tighten_tools(components: dict, chat_name: str) -> None:
    """`prepare_tools`' rules: a function's parameters are an object's schema; tool_choice other than "none"
    only with tools. That a named tool_choice names one of the tools is a documented 400 (JSON Schema
    cannot compare two values of a body)."""
    params = components["FunctionDefinition"]["properties"]["parameters"]
    params["anyOf"] = [{"type": "object", "properties": {"type": {"const": "object"}}}, {"type": "null"}]
    components[chat_name]["properties"]["tools"]["anyOf"][0]["maxItems"] = MAX_TOOLS
    components[chat_name].setdefault("allOf", []).append({"anyOf": [
        {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
        {"properties": {"tool_choice": {"enum": [None, "none"]}}}]})


def _content_part_schema(generated: dict) -> dict:
    """Only text parts, carrying text only."""
    props = {**generated["properties"], "type": {"const": "text"}, "text": {"type": "string"}}
    for name in OTHER_PART_FIELDS:
        props[name] = {"type": "null", "default": None}
    return {**generated, "properties": props, "required": ["type", "text"]}


def request_schemas() -> tuple[str, str, dict]:
    """(completion schema name, chat schema name, components): the structs' schemas plus `prepare`'s rules."""
    (completion, chat), components = msgspec.json.schema_components(
        [CompletionRequest, ChatCompletionRequest], ref_template=_REF)
    completion_name, chat_name = (s["$ref"].rsplit("/", 1)[1] for s in (completion, chat))
    _tighten_sampling(components[completion_name], "completion")
    _tighten_sampling(components[chat_name], "chat")
    components[completion_name]["properties"]["prompt"] = _prompt_schema()
    # `prepare` refuses the two when they differ; equality is not a JSON Schema rule, so the document says
    # "send one of them" (one notch stricter than the server, which tolerates an equal pair).
    components[chat_name]["not"] = {"required": ["max_tokens", "max_completion_tokens"], "properties": {
        "max_tokens": {"type": "integer"}, "max_completion_tokens": {"type": "integer"}}}
    components[chat_name]["properties"]["max_tokens"]["description"] = (
        "The older name of max_completion_tokens: send one of them.")
    components["StreamOptions"]["properties"]["include_obfuscation"] = {"enum": [None, False], "default": None}
    components["ChatMessage"] = _chat_message_schema(components["ChatMessage"])
    _tighten_tools(components, chat_name)
    components["ContentPart"] = _content_part_schema(components["ContentPart"])
    tighten_structured(components, completion_name, chat_name)
    return completion_name, chat_name, components


def _json_content(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _errors(*statuses: str) -> dict:
    return {s: {"description": _ERROR_TEXT[s], "content": _json_content({"$ref": _REF.format(name="ErrorResponse")})}
            for s in statuses}


def _generate_op(summary: str, schema_name: str, object_name: str) -> dict:
    responses = {
        "200": {
            "description": f"A `{object_name}` object, or with `stream: true` server-sent events: "
                           f"`data: <{object_name} chunk>` frames, a `: server-timing` comment, then `data: [DONE]`.",
            "headers": {
                "X-Request-Id": {"schema": {"type": "string"}},
                "X-Inferd-Model-Version": {"schema": {"type": "string"}},
                "X-Inferd-Simulated": {"schema": {"type": "string", "enum": ["true"]}},
                "Server-Timing": {"schema": {"type": "string"}, "description": "non-streaming only"},
                "X-Inferd-Degraded": {"schema": {"type": "string"},
                                      "description": "what overload degradation did ([degrade.<route>])"},
            },
            "content": {"application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {"type": "string"}}},
        },
        **_errors(*_GENERATE_ERRORS),
    }
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json_content({"$ref": _REF.format(name=schema_name)})},
        "responses": responses,
    }}


def _embeddings_op() -> dict:
    """POST /v1/embeddings: EmbeddingRequest's schema with non-empty inputs. What depends on the model (an
    input's length against its context, token ids against its vocabulary, `dimensions` against its width,
    a model that is not an embedding model) is a documented 400."""
    schema = msgspec.json.schema(EmbeddingRequest)
    schema = schema["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    token_ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    text = {"type": "string", "minLength": 1}
    schema["properties"]["model"] = {"type": "string", "pattern": MODEL_PATTERN}
    schema["properties"]["input"] = {"anyOf": [
        text, token_ids, {"type": "array", "items": text, "minItems": 1, "maxItems": MAX_INPUTS},
        {"type": "array", "items": token_ids, "minItems": 1, "maxItems": MAX_INPUTS}]}
    responses = {"200": {"description": "A `list` of `embedding` objects (float arrays, or base64 of little-endian "
                                        "float32 with encoding_format = base64) and the usage",
                         "headers": {"X-Request-Id": {"schema": {"type": "string"}},
                                     "X-Inferd-Model-Version": {"schema": {"type": "string"}},
                                     "Server-Timing": {"schema": {"type": "string"}}},
                         "content": _json_content({"type": "object"})},
                 **_errors(*_GENERATE_ERRORS)}
    return {"post": {"summary": "Create embeddings (models with task = embed)",
                     "requestBody": {"required": True, "content": _json_content(schema)}, "responses": responses}}


def _get(summary: str, *errors: str, content_type: str = "application/json", parameters: list | None = None) -> dict:
    op = {"summary": summary,
          "responses": {"200": {"description": "OK", "content": {content_type: {"schema": {}}}}, **_errors(*errors)}}
    if parameters:
        op["parameters"] = parameters
    return {"get": op}


def _usage_op() -> dict:
    """GET /admin/usage: totals or rows, as JSON, CSV or JSON lines (the `format` parameter)."""
    op = _get("Admin: usage ledger totals per tenant/model/day, or rows (rows=true); filters tenant, model, "
              "since, until", *_ADMIN_ERRORS, "400", "404", parameters=[
                  *(_query_param(n) for n in ("tenant", "model", "since", "until")),
                  _query_param("format", {"type": "string", "enum": ["json", "csv", "jsonl"]}),
                  _query_param("rows", {"type": "string", "enum": ["true", "false"]}),
                  _query_param("after", {"type": "integer", "minimum": 0}),
                  _query_param("limit", {"type": "integer", "minimum": 1, "maximum": 10000})])
    op["get"]["responses"]["200"]["content"] = {t: {"schema": {}} for t in (
        "application/json", "text/csv", "application/x-ndjson")}
    return op


def _adapters_op() -> dict:
    """POST /admin/adapters: the body is AdapterAction's schema; model and adapter are names, not blank."""
    schema = msgspec.json.schema(AdapterAction)
    schema = schema["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    for name in ("model", "adapter"):
        schema["properties"][name] = {"type": "string", "pattern": r"\S"}
    schema["properties"]["reason"] = {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    responses = {"200": {"description": "The adapter after the action (AdapterInfo fields, per version in "
                                        "`versions`)", "content": _json_content({"type": "object"})},
                 **_errors("400", *_ADMIN_ERRORS, "404", "409", "422")}
    responses["409"] = {**responses["409"], "description": "The adapter is in use, or every adapter slot is"}
    return {"post": {"summary": "Admin: load or unload a model's LoRA adapter now (audited)",
                     "requestBody": {"required": True, "content": _json_content(schema)}, "responses": responses}}


def _query_param(name: str, schema: dict | None = None) -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema or {"type": "string"}}


def _path_param(name: str, schema: dict) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema}


_ROLLOUT_NAME = _path_param("name", {"type": "string", "minLength": 1})
_ADMIN_ERRORS = ("401", "403", "503")


@functools.cache
def document() -> dict:
    completion, chat, components = request_schemas()
    components["ErrorResponse"] = _ERROR
    note = ", ".join(f"`{k}`" for k in NO_OP_VALUES)
    return {
        "openapi": "3.1.0",
        "info": {"title": "inferd", "version": __version__,
                 "description": "OpenAI-compatible inference API. Unknown parameters are rejected; OpenAI "
                                f"parameters the server does not implement ({note}, `logprobs`) are accepted "
                                "only at their no-op value."},
        "paths": {
            "/v1/completions": _generate_op("Create a completion", completion, "text_completion"),
            "/v1/chat/completions": _generate_op("Create a chat completion", chat, "chat.completion"),
            "/v1/embeddings": _embeddings_op(),
            "/v1/models": _get("List the served models", "401", "403"),
            "/healthz": _get("Liveness: the process answers"),
            "/health": _get("Liveness, as /healthz (the name vLLM-style load tools probe)"),
            "/readyz": _get("Readiness: 200 when serving, 503 with reasons otherwise", "503"),
            "/metrics": _get("Prometheus metrics", "401", "403", content_type="text/plain"),
            "/openapi.json": _get("This document"),
            "/admin/rollouts": _get("Admin: every rollout's state", *_ADMIN_ERRORS),
            "/admin/rollouts/{name}": _get("Admin: one rollout's state", *_ADMIN_ERRORS, "404",
                                           parameters=[_ROLLOUT_NAME]),
            "/admin/rollouts/{name}/{action}": {"post": {
                "summary": "Admin: start, pause, resume, promote or roll back a rollout (audited)",
                "parameters": [_ROLLOUT_NAME, _path_param("action", {"type": "string", "enum": list(ROLLOUT_ACTIONS)})],
                "responses": {"200": {"description": "The rollout's new state", "content": _json_content({})},
                              **_errors("400", *_ADMIN_ERRORS, "404", "409")}}},
            "/admin/shadow": _get("Admin: shadow traffic per version", *_ADMIN_ERRORS),
            "/admin/usage": _usage_op(),
            "/admin/adapters": _adapters_op(),
            "/admin/models": _get("Admin: configured versions under the memory budget, their state and bytes "
                                  "(404 without [server] model_memory_bytes)", *_ADMIN_ERRORS, "404"),
            "/admin/models/{name}/{action}": {"post": {
                "summary": "Admin: load a model version ahead of traffic, or unload it (audited)",
                "parameters": [_path_param("name", {"type": "string", "minLength": 1}),
                               _path_param("action", {"type": "string", "enum": ["load", "unload"]})],
                "responses": {"200": {"description": "The version's state after it", "content": _json_content({})},
                              **_errors(*_ADMIN_ERRORS, "404", "409")}}},
            "/admin/peers": _get("Admin: cluster members, their state and load hints (404 without [cluster])",
                                 *_ADMIN_ERRORS, "404"),
            # OpenAI's Responses API (inferd.api.routes.openapi_responses); its schemas join `components`
            **responses_paths({"type": "string", "pattern": MODEL_PATTERN}, _REF, _errors, _GENERATE_ERRORS,
                              components),
            **batch_paths(),        # the Batch API: /v1/files, /v1/batches (inferd.api.routes.openapi_batches)
            # GET /v1/models/{model}, and vLLM's tokenizer routes (inferd.api.routes.openapi_tokenization)
            **tokenization_paths({"type": "string", "pattern": MODEL_PATTERN}, _REF.format(name="ChatMessage"),
                                 _errors),
        },
        "components": {"schemas": components},
    }


@functools.cache
def openapi_document() -> bytes:
    return orjson.dumps(document())
