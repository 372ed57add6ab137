"""The OpenAPI 3.1 document, with request schemas generated from the structs the decoder uses.

Because /v1/completions and /v1/chat/completions decode with exactly these msgspec structs
(unknown fields rejected), the document cannot drift from what the server accepts.
"""
from __future__ import annotations

import functools

import msgspec
import orjson

from inferd import __version__
from inferd.api.openai import NO_OP_VALUES, ChatCompletionRequest, CompletionRequest

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

_ERROR_STATUSES = {
    "400": "Invalid request: the message and `param` name the field",
    "404": "Unknown model",
    "413": "Body larger than server.max_body_bytes",
    "415": "Content-Type is not application/json",
    "500": "Server error (never caused by the request's content)",
    "503": "Draining or engine unavailable (Retry-After)",
    "504": "The request's deadline passed",
}


def _json_content(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _generate_op(summary: str, schema_name: str, object_name: str) -> dict:
    responses = {
        "200": {
            "description": f"A `{object_name}` object, or with `stream: true` server-sent events: "
                           f"`data: <{object_name} chunk>` frames, then `data: [DONE]`.",
            "headers": {
                "X-Request-Id": {"schema": {"type": "string"}},
                "X-Inferd-Model-Version": {"schema": {"type": "string"}},
                "X-Inferd-Simulated": {"schema": {"type": "string", "enum": ["true"]}},
                "Server-Timing": {"schema": {"type": "string"}, "description": "non-streaming only"},
            },
            "content": {"application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {"type": "string"}}},
        },
    }
    for status, text in _ERROR_STATUSES.items():
        responses[status] = {"description": text,
                             "content": _json_content({"$ref": _REF.format(name="ErrorResponse")})}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json_content({"$ref": _REF.format(name=schema_name)})},
        "responses": responses,
    }}


def _plain_get(summary: str, content_type: str = "application/json") -> dict:
    return {"get": {"summary": summary, "responses": {"200": {"description": "OK",
                                                              "content": {content_type: {"schema": {}}}}}}}


@functools.cache
def document() -> dict:
    (completion, chat), components = msgspec.json.schema_components(
        [CompletionRequest, ChatCompletionRequest], ref_template=_REF)
    components["ErrorResponse"] = _ERROR
    note = ", ".join(f"`{k}`" for k in NO_OP_VALUES)
    return {
        "openapi": "3.1.0",
        "info": {"title": "inferd", "version": __version__,
                 "description": "OpenAI-compatible inference API. Unknown parameters are rejected; OpenAI "
                                f"parameters the server does not implement ({note}, `logprobs`) are accepted "
                                "only at their no-op value."},
        "paths": {
            "/v1/completions": _generate_op("Create a completion", completion["$ref"].rsplit("/", 1)[1],
                                            "text_completion"),
            "/v1/chat/completions": _generate_op("Create a chat completion", chat["$ref"].rsplit("/", 1)[1],
                                                 "chat.completion"),
            "/v1/models": _plain_get("List the served models"),
            "/healthz": _plain_get("Liveness: the process answers"),
            "/health": _plain_get("Liveness, as /healthz (the name vLLM-style load tools probe)"),
            "/readyz": _plain_get("Readiness: 200 when serving, 503 with reasons otherwise"),
            "/metrics": _plain_get("Prometheus metrics", "text/plain"),
            "/openapi.json": _plain_get("This document"),
            "/admin/rollouts": _plain_get("Admin: every rollout's state"),
            "/admin/rollouts/{name}": _plain_get("Admin: one rollout's state"),
            "/admin/rollouts/{name}/{action}": {"post": {
                "summary": "Admin: start, pause, resume, promote or roll back a rollout (audited)",
                "responses": {"200": {"description": "The rollout's new state", "content": _json_content({})}}}},
            "/admin/shadow": _plain_get("Admin: shadow traffic per version"),
        },
        "components": {"schemas": components},
    }


@functools.cache
def openapi_document() -> bytes:
    return orjson.dumps(document())
