"""Reading a JSON request body: its Content-Type, and its bytes up to a limit, refused early by length."""
from __future__ import annotations

from aiohttp import web

from inferd.api.errors import ApiError, body_too_large


def check_json_content_type(request: web.BaseRequest) -> None:
    if request.content_type != "application/json":
        raise ApiError(415, f"Content-Type must be application/json, got {request.content_type!r}.",
                       code="unsupported_media_type")


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The body, refusing more than `limit` bytes: by Content-Length up front, and while reading
    (every chunk as it arrives: `content.read(n)` would stop at the first)."""
    length = request.content_length
    if length is not None and length > limit:
        raise body_too_large(limit)
    chunks = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
