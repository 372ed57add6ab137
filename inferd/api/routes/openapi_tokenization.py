"""The tokenizer operations of the OpenAPI document (vLLM's /tokenize, /detokenize, /tokenizer_info) and
GET /v1/models/{model}; inferd.api.routes.openapi merges them in.

The request schemas are generated from the structs /tokenize and /detokenize decode with, plus the rules
checked after decoding: one of `prompt` or `messages`, the chat-only options only with `messages`,
`continue_final_message` only false, and the messages as the chat route's schema allows them. What no schema
can say is a documented 400: a token id outside the model's vocabulary (`invalid_token_id`), a chat the
model's template refuses (`invalid_messages`).
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from inferd.api.wire.tokenization import CHAT_ONLY, DetokenizeRequest, TokenizeRequest

_ERRORS = ("400", "401", "403", "404", "413", "415", "429", "500", "503", "504")
_NULL = {"type": "null"}


def _struct_schema(struct: type) -> dict:
    schema = msgspec.json.schema(struct)
    return schema["$defs"][schema["$ref"].rsplit("/", 1)[1]]


def _tokenize_schema(model: dict, chat_message_ref: str) -> dict:
    schema = _struct_schema(TokenizeRequest)
    props = schema["properties"]
    props["model"] = {"anyOf": [model, _NULL], "default": None}
    props["messages"]["anyOf"][0]["items"] = {"$ref": chat_message_ref}
    props["continue_final_message"] = {"enum": [None, False], "default": None,
                                       "description": "Not implemented by this server: accepted only as null or false."}
    schema["anyOf"] = [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "messages": _NULL,
                                                **{name: _NULL for name in CHAT_ONLY}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}, "prompt": _NULL}},
    ]
    return schema


def _detokenize_schema(model: dict) -> dict:
    schema = _struct_schema(DetokenizeRequest)
    schema["properties"]["model"] = {"anyOf": [model, _NULL], "default": None}
    return schema


_TOKENIZE_RESPONSE = {"type": "object", "required": ["count", "max_model_len", "tokens", "token_strs"], "properties": {
    "count": {"type": "integer"}, "max_model_len": {"type": "integer"},
    "tokens": {"type": "array", "items": {"type": "integer"}},
    "token_strs": {"anyOf": [{"type": "array", "items": {"type": "string"}}, _NULL]}}}
_DETOKENIZE_RESPONSE = {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}
_INFO_RESPONSE = {"type": "object", "required": ["tokenizer_class", "model", "eos_token"], "properties": {
    "tokenizer_class": {"type": "string"}, "model": {"type": "string"},
    "bos_token": {"type": ["string", "null"]}, "eos_token": {"type": ["string", "null"]},
    "model_max_length": {"type": "integer"}, "vocab_size": {"type": "integer"}, "chat_template": {"type": "string"}}}
_MODEL_RESPONSE = {"type": "object", "required": ["id", "object", "created", "owned_by"], "properties": {
    "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
    "owned_by": {"type": "string"}}}


def _ok(description: str, schema: dict) -> dict:
    return {"description": description, "headers": {"X-Request-Id": {"schema": {"type": "string"}}},
            "content": {"application/json": {"schema": schema}}}


def _post(summary: str, body: dict, ok: dict, errors: Callable[..., dict]) -> dict:
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {"application/json": {
        "schema": body}}}, "responses": {"200": ok, **errors(*_ERRORS)}}}


def tokenization_paths(model: dict, chat_message_ref: str, errors: Callable[..., dict]) -> dict:
    """The paths: `model` is the schema of a model name as routing accepts it, `chat_message_ref` the chat
    route's message schema, `errors(*statuses)` the documented error responses."""
    optional_model = {"name": "model", "in": "query", "required": False, "schema": model,
                      "description": "Whose tokenizer: a model name as /v1/completions takes it (default: the "
                                     "first generative model the caller may use, in GET /v1/models order)"}
    return {
        "/v1/models/{model}": {"get": {
            "summary": "One served model, as GET /v1/models lists it (404 model_not_found for any other)",
            "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": _ok("The model object", _MODEL_RESPONSE), **errors("401", "403", "404")}}},
        "/tokenize": _post("vLLM's tokenizer: a prompt, or messages through the model's chat template, to token "
                           "ids (default model: as GET /tokenizer_info)",
                           _tokenize_schema(model, chat_message_ref),
                           _ok("Token ids, their count and the model's context length (token_strs with "
                               "return_token_strs)", _TOKENIZE_RESPONSE), errors),
        "/detokenize": _post("vLLM's detokenizer: token ids to text, special tokens included",
                             _detokenize_schema(model), _ok("The text", _DETOKENIZE_RESPONSE), errors),
        "/tokenizer_info": {"get": {
            "summary": "vLLM's tokenizer configuration: tokenizer_class, special tokens, chat template",
            "parameters": [optional_model],
            "responses": {"200": _ok("The tokenizer's configuration", _INFO_RESPONSE),
                          **errors("400", "401", "403", "404", "429", "500", "503", "504")}}},
    }
