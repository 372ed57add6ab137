"""The OpenAI error envelope and the typed errors handlers raise to produce it.

Handlers raise `ApiError` (or one of its constructors below); the middleware in app.py turns it,
aiohttp's own HTTP errors and anything unexpected into `{"error": {message, type, param, code}}`.
"""
from __future__ import annotations

import orjson
from aiohttp import web

# OpenAI's `type` values; clients (and the SDK) key off the HTTP status, people read the type.
INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"
TIMEOUT = "timeout_error"


class ApiError(Exception):
    """An error answered with the OpenAI envelope; `message` is safe to show the client."""

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist on this server; GET /v1/models lists them.",
                    type=NOT_FOUND, param="model", code="model_not_found")


def unavailable(message: str, retry_after_s: int = 1, code: str = "unavailable") -> ApiError:
    return ApiError(503, message, type=UNAVAILABLE, code=code, headers={"Retry-After": str(retry_after_s)})


def body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body is larger than the server's limit of {limit} bytes.",
                    code="request_too_large")


def encode_error(err: ApiError) -> bytes:
    return orjson.dumps({"error": err.body()})


def error_response(err: ApiError, request_id: str | None = None) -> web.Response:
    headers = dict(err.headers)
    if request_id:
        headers["X-Request-Id"] = request_id
    return web.Response(status=err.status, body=encode_error(err),
                        content_type="application/json", headers=headers)


def from_http_exception(exc: web.HTTPException, limit: int) -> ApiError:
    """aiohttp's own errors (router 404/405, body over client_max_size, ...) in our envelope."""
    status = exc.status
    if status == 413:
        return body_too_large(limit)
    if status == 404:
        return ApiError(404, "Not found: no such route.", type=NOT_FOUND, code="route_not_found")
    if status == 405:
        err = ApiError(405, f"Method not allowed; allowed: {exc.headers.get('Allow', '')}.",
                       code="method_not_allowed")
        if "Allow" in exc.headers:
            err.headers["Allow"] = exc.headers["Allow"]
        return err
    kind = SERVER_ERROR if status >= 500 else INVALID_REQUEST
    return ApiError(status, exc.reason or "HTTP error", type=kind, code=None)
