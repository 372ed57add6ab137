"""Authentication for HTTP handlers: `Authorization: Bearer <key>` -> Principal, or a 401/403 envelope.

Each handler that needs a caller calls `authenticate(request, scope)` (inference routes) or
`require_scope(request, scope)` (admin and metrics routes): scopes are per route, so a function the
handler calls says plainly what the route needs, where a middleware would need a route table.
/healthz, /readyz and /openapi.json call neither and stay open.

With `auth.mode = "none"` every caller is the anonymous tenant (`local`) with every scope. The
tenant comes only from the key (or a verified client certificate, below), never from the request body.

mTLS: a request with no `Authorization` header over a connection whose client certificate (verified
against `server.tls.client_ca_file` during the handshake) has a subject listed in
`server.tls.tenant_by_subject` is that tenant, with the `inference` scope only (admin and metrics
need a key). The subject is matched as RFC 4514 text, e.g. "CN=alice,O=acme", which is what
`openssl x509 -noout -subject -nameopt RFC2253` prints. Key checks are constant-time and an
unknown key costs the same as a wrong one (inferd.tenancy.keys.KeyStore.verify).
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.errors import INVALID_REQUEST, ApiError
from inferd.tenancy import AuthError, InsufficientScope, Principal

PERMISSION = "permission_error"

PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("inferd_principal", Principal)
# Inference requests, counted per tenant (inferd_tenant_requests_total)
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings"})
CERTIFICATE_SCOPES = frozenset({"inference"})
# getpeercert() attribute names -> the short names RFC 4514 (and openssl) write.
_RDN_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
              "localityName": "L", "stateOrProvinceName": "ST", "domainComponent": "DC", "userId": "UID",
              "streetAddress": "STREET"}


def authenticate(request: web.BaseRequest, scope: str = "inference") -> Principal:
    """The caller of `request`, who must hold `scope`. Raises ApiError 401 (no key, malformed header,
    unknown/wrong/revoked key) or 403 (the key lacks the scope). Remembered on the request: a second
    call (another scope) checks the same principal without hashing the key again."""
    known = request.get(PRINCIPAL)
    if known is not None:
        if scope not in known.scopes:
            raise _forbidden(f"This API key lacks the {scope!r} scope needed here.")
        return known
    state = request.app[keys.STATE]
    header = request.headers.get("Authorization")
    tls = state.config.server.tls
    # Only a listener that asks for client certificates can have one: skip the lookup otherwise.
    subject = client_subject(request) if header is None and tls is not None and tls.client_ca_file else None
    tenant_by_subject = tls.tenant_by_subject if tls is not None else {}
    if subject is not None and subject in tenant_by_subject:
        if scope not in CERTIFICATE_SCOPES:
            raise _forbidden(f"A client certificate grants only the 'inference' scope; {scope!r} needs an API key.")
        principal = Principal(tenant=tenant_by_subject[subject], key_id=None, scopes=CERTIFICATE_SCOPES)
    else:
        try:
            principal = state.tenancy.authenticator.authenticate(header, scope)
        except InsufficientScope as exc:
            raise _forbidden(f"This API key lacks the {scope!r} scope needed here.") from exc
        except AuthError as exc:
            raise _unauthorized(exc) from None
    request[PRINCIPAL] = principal
    fields = request.get(keys.LOG_FIELDS)
    if fields is not None:
        fields["tenant"] = principal.tenant
        if subject is not None:
            fields["client_subject"] = subject
        if principal.key_id is not None:
            fields["key_id"] = principal.key_id
    return principal


def client_subject(request: web.BaseRequest) -> str | None:
    """The verified client certificate's subject as RFC 4514 text ("CN=alice,O=acme"), or None."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:        # plain HTTP, no client CA configured, or an optional certificate not sent
        return None
    return rfc4514(cert.get("subject", ()))


def rfc4514(subject: Any) -> str:
    """getpeercert()'s subject (RDNs, most significant first) as RFC 4514 text (least significant first)."""
    rdns = ["+".join(f"{_RDN_NAMES.get(k, k)}={_escape(v)}" for k, v in rdn) for rdn in subject]
    return ",".join(reversed(rdns))


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if out[:1] in ("#", " "):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def require_scope(request: web.BaseRequest, scope: str) -> Principal:
    """For admin / metrics handlers: the caller, holding `scope` (`admin`, `metrics`, `inference`).
    Only ever raises ApiError (401/403), so a handler can call it first and do nothing else."""
    if scope not in ("inference", "admin", "metrics"):
        raise ValueError(f"unknown scope {scope!r}")          # a programming error, not a client's
    return authenticate(request, scope)


def count_tenant_request(request: web.BaseRequest, status: int) -> None:
    """inferd_tenant_requests_total{tenant, status}, once per authenticated inference request (the front
    middleware calls it with the final status; a stream's status is its outcome, e.g. 504)."""
    principal = request.get(PRINCIPAL)
    if principal is None or request.path not in GENERATION_PATHS:
        return
    state = request.app[keys.STATE]
    state.metrics.count_tenant_request(state.tenancy.tenants.label(principal.tenant), status)


def _unauthorized(exc: AuthError) -> ApiError:
    # type invalid_request_error as OpenAI's; code missing_api_key (no or malformed header) or
    # invalid_api_key (unknown, wrong or revoked: deliberately one answer). The key is never echoed.
    missing = exc.code == "missing_api_key"
    if not missing:
        message = "Incorrect API key provided (unknown, wrong or revoked)."
    elif "malformed" in str(exc):
        message = "Malformed Authorization header: expected `Authorization: Bearer <key>`."
    else:
        message = "Missing API key: send `Authorization: Bearer <key>`."
    challenge = 'Bearer realm="inferd"' if missing else 'Bearer realm="inferd", error="invalid_token"'
    return ApiError(401, message, type=INVALID_REQUEST, code=exc.code, headers={"WWW-Authenticate": challenge})


def _forbidden(message: str) -> ApiError:
    return ApiError(403, message, type=PERMISSION, code="insufficient_scope")


def model_forbidden(tenant: str, model: str) -> ApiError:
    return ApiError(403, f"Tenant {tenant!r} may not use the model `{model}`.", type=PERMISSION,
                    param="model", code="model_not_allowed")
