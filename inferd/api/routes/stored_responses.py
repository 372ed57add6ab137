"""GET and DELETE /v1/responses/{response_id}: a stored response of the Responses API, by its tenant.

Another tenant's id, an expired one, and one older than the tenant's retention period now all answer
404, as an unknown id does. POST /v1/responses is the generation pipeline's (inferd.api.pipeline.run).
"""
from __future__ import annotations


from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.auth import authenticate
from inferd.api.errors import invalid, store_unavailable
from inferd.api.pipeline.responses import find_stored, not_found
from inferd.api.routes.stored import json_response
from inferd.store import StoreError, StoredConversation

# OpenAI's query parameters of GET, accepted at their no-op value only (a stored response is not replayed as
# a stream, and has no extra fields to include).
NO_OP_QUERY = {"stream": ("false",), "include_obfuscation": ("false",)}


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/responses/{response_id}", retrieve_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)


async def _find(request: web.Request) -> tuple[str, str, StoredConversation | None]:
    tenant = authenticate(request, "inference").tenant
    response_id = request.match_info["response_id"]
    return tenant, response_id, await find_stored(request.app[keys.STATE], tenant, response_id)


async def retrieve_response(request: web.Request) -> web.Response:
    for name, value in request.query.items():
        if name not in NO_OP_QUERY:
            raise invalid(f"Unrecognized query parameter: {name}", param=name, code="unknown_parameter")
        if value not in NO_OP_QUERY[name]:
            raise invalid(f"{name}: not supported by this server (got {value[:40]!r}).", param=name,
                          code="unsupported_parameter")
    _, response_id, found = await _find(request)
    if found is None:
        raise not_found(response_id, "response_id")
    return web.Response(body=found.response.encode(), content_type="application/json")


async def delete_response(request: web.Request) -> web.Response:
    tenant, response_id, found = await _find(request)
    if found is None:
        raise not_found(response_id, "response_id")
    try:
        await request.app[keys.STATE].storage.responses.delete(tenant, response_id)
    except StoreError:
        raise store_unavailable() from None
    return json_response({"id": response_id, "object": "response", "deleted": True})
