"""Requests the daemon sends itself: the Batch API's runner posts each batch line to its own listener.

Such a request carries `X-Inferd-Batch: <secret> <tenant> <batch id>`, where the secret is made at
random when the process starts and never leaves it (the runner gets it from ServerState). It stands
for the batch's tenant (who created the batch with its own key), is admitted in the `batch` priority
class, and its ledger row names the batch. A wrong secret is a 401, as a wrong API key is.
"""
from __future__ import annotations

import hmac
import secrets

from aiohttp import web

from inferd.api.errors import INVALID_REQUEST, ApiError
from inferd.config import TENANT_NAME_RE

HEADER = "X-Inferd-Batch"


def new_secret() -> str:
    return secrets.token_hex(32)


def header_value(secret: str, tenant: str, batch_id: str) -> str:
    return f"{secret} {tenant} {batch_id}"


def batch_caller(request: web.BaseRequest, secret: str) -> tuple[str, str] | None:
    """(tenant, batch id) of a batch line the runner sent, None for any other request; 401 for a
    header that does not carry this process's secret."""
    value = request.headers.get(HEADER)
    if value is None:
        return None
    parts = value.split(" ")
    if len(parts) != 3 or not hmac.compare_digest(parts[0], secret) or not TENANT_NAME_RE.match(parts[1]):
        raise ApiError(401, f"Invalid {HEADER} header.", type=INVALID_REQUEST, code="invalid_api_key")
    return parts[1], parts[2]
