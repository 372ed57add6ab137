"""The OpenAI error envelope and the typed errors handlers raise to produce it.

Handlers raise `ApiError` (or one of its constructors below); the middleware in app.py turns it,
aiohttp's own HTTP errors and anything unexpected into `{"error": {message, type, param, code}}`.
"""
from __future__ import annotations

import math

import orjson
from aiohttp import http_exceptions, web

# OpenAI's `type` values; clients (and the SDK) key off the HTTP status, people read the type.
INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"
TIMEOUT = "timeout_error"
CLIENT_GONE = 499              # status label for requests whose client left (nginx's convention)


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


def store_unavailable(retry_after_s: float = 1.0) -> ApiError:
    """The durable store failed (disk full, database unreachable): nothing that must be recorded runs."""
    return unavailable("The server cannot record requests right now (its store failed: disk full or database "
                       "unreachable), so none is served; retry later.",
                       retry_after_s=max(1, math.ceil(retry_after_s)), code="store_unavailable")


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


# -- the listener's own answers (inferd.daemon.listener): before any route or middleware runs ----------

# The `Server` response header: the product, never the Python or aiohttp version it runs on.
SERVER_HEADER = "inferd"

# Parser refusals by kind: (metric reason label, HTTP status, error code, message). The message is fixed
# per kind: the parser's own text quotes up to 100 bytes of what the client sent, which we never echo.
_BAD_LINE = ("bad_request_line", 400, "invalid_request_line", "Malformed HTTP request line.")
_URI_TOO_LONG = ("uri_too_long", 414, "uri_too_long", "The request target is longer than the server accepts.")
_HEADER_TOO_LARGE = ("header_too_large", 431, "request_header_too_large",
                     "A request header field, or the number of header fields, is larger than the server accepts.")
_INVALID_HEADER = ("invalid_header", 400, "invalid_header", "Malformed HTTP header.")
_FRAMING = ("invalid_framing", 400, "invalid_message_framing",
            "Ambiguous or invalid message framing (Content-Length / Transfer-Encoding).")
_BAD_REQUEST = ("bad_request", 400, "malformed_request", "Malformed HTTP request.")


def _protocol_kind(exc: BaseException | None) -> tuple[str, int, str, str]:
    if isinstance(exc, http_exceptions.BadStatusLine):           # includes BadHttpMethod (TLS on a plain port)
        return _BAD_LINE
    if isinstance(exc, http_exceptions.InvalidURLError):
        return _BAD_LINE
    if isinstance(exc, http_exceptions.LineTooLong):
        # aiohttp raises the same class for the request target and for a header; the target is the one
        # that starts with "/" (origin form, what HTTP/1.1 clients send to a server).
        line = exc.args[0] if exc.args else b""
        is_target = isinstance(line, bytes | bytearray | str) and line[:1] in (b"/", "/")
        return _URI_TOO_LONG if is_target else _HEADER_TOO_LARGE
    if isinstance(exc, http_exceptions.InvalidHeader):
        return _INVALID_HEADER
    text = getattr(exc, "message", "") or ""
    if text.startswith("Too many headers"):
        return _HEADER_TOO_LARGE
    if "Content-Length" in text or "Transfer-Encoding" in text or "transfer" in text.lower():
        return _FRAMING                                           # request smuggling shapes: CL+TE, duplicate CL
    if "header" in text.lower():
        return _INVALID_HEADER
    return _BAD_REQUEST


def protocol_error_response(exc: BaseException | None) -> tuple[str, web.Response]:
    """A request the HTTP parser refused (bad request line, header too large, CL+TE, ...): its bounded
    reason label and the enveloped 4xx answer. The connection closes after it."""
    reason, status, code, message = _protocol_kind(exc)
    resp = error_response(ApiError(status, message, code=code))
    resp.headers["Server"] = SERVER_HEADER
    resp.force_close()
    return reason, resp


def internal_error_response() -> web.Response:
    """An error that escaped the app (a bug), answered by the listener: enveloped, no traceback."""
    resp = error_response(ApiError(500, "Internal server error.", type=SERVER_ERROR, code="internal_error"))
    resp.headers["Server"] = SERVER_HEADER
    resp.force_close()
    return resp


def too_many_connections_response() -> web.Response:
    """A non-probe request on a connection accepted over server.max_connections (probe reserve only)."""
    resp = error_response(unavailable("The server has too many open connections; retry shortly.",
                                      code="too_many_connections"))
    resp.headers["Server"] = SERVER_HEADER
    resp.force_close()
    return resp


def draining() -> ApiError:
    """503 for new work on a node that is draining (the request path and the tokenizer routes)."""
    return unavailable("The server is draining; retry on another node.", code="draining")
