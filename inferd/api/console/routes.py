"""/admin/ui: sign-in, sign-out, and each view's page; every response carries a strict Content-Security-Policy.

A request without a valid session gets the sign-in page (a GET) or a 403 (a POST). Signing in takes an
admin key once (checked as the API checks it: the `admin` scope) and answers with a session cookie
(inferd.api.console.session). Every POST must carry a form token of its session, used once.
"""
from __future__ import annotations

import asyncio
import math
from pathlib import Path
from urllib.parse import parse_qsl

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.console import keys_view, models_view, now_view, ops_views, pages, tenants_view
from inferd.api.console.samples import Samples
from inferd.api.console.session import ConsoleSessions, Session, SignInLimiter
from inferd.tenancy import AuthError, InsufficientScope

COOKIE = "inferd_console"
# Nothing from outside the daemon, no inline script or style, no framing, forms only to here.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
STATIC = Path(__file__).resolve().parent / "static"
MAX_FORM_BYTES = 4096
SESSIONS: web.AppKey[ConsoleSessions] = web.AppKey("inferd_console_sessions", ConsoleSessions)
SAMPLES: web.AppKey[Samples] = web.AppKey("inferd_console_samples", Samples)
LIMITER: web.AppKey[SignInLimiter] = web.AppKey("inferd_console_sign_ins", SignInLimiter)
# The files a page may load, all shipped in the wheel (static/vendor/VERSIONS names their sources).
STATIC_FILES = {"console.css": "text/css", "console.js": "text/javascript",
                "vendor/htmx.min.js": "text/javascript", "vendor/uPlot.iife.min.js": "text/javascript",
                "vendor/uPlot.min.css": "text/css"}


def add_routes(app: web.Application) -> None:
    app[SESSIONS] = ConsoleSessions()
    app[LIMITER] = SignInLimiter()
    app[SAMPLES] = Samples()
    app.cleanup_ctx.append(_sampling)
    app.router.add_get("/admin/ui", home)
    app.router.add_get("/admin/ui/login", login_page)
    app.router.add_post("/admin/ui/login", login)
    app.router.add_post("/admin/ui/logout", logout)
    app.router.add_get("/admin/ui/now", view(now_view.render))
    app.router.add_get("/admin/ui/tenants", view(tenants_view.render))
    app.router.add_get("/admin/ui/models", view(models_view.render))
    app.router.add_get("/admin/ui/slos", view(ops_views.slos))
    app.router.add_get("/admin/ui/cluster", view(ops_views.cluster))
    app.router.add_get("/admin/ui/jobs", view(ops_views.jobs))
    app.router.add_get("/admin/ui/keys", view(keys_view.render))
    app.router.add_post("/admin/ui/keys", change(keys_view.create))
    app.router.add_post("/admin/ui/keys/{key_id}/revoke", change(keys_view.revoke))
    app.router.add_get("/admin/ui/now/series", data(lambda request, session, sessions: _series(request)))
    app.router.add_get("/admin/ui/tenants/daily", data(tenants_view.daily))
    app.router.add_get("/admin/ui/static/{name:.+}", static_file)


async def home(request: web.Request) -> web.Response:
    return _redirect("/admin/ui/now")


def html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    response = web.Response(text=body, status=status, content_type="text/html", charset="utf-8")
    _secure(response, headers)
    return response


def _secure(response: web.StreamResponse, headers: dict[str, str] | None = None) -> None:
    response.headers.update({"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                             "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
                             "X-Frame-Options": "DENY", **(headers or {})})


def _redirect(location: str) -> web.Response:
    response = web.Response(status=303, headers={"Location": location})
    _secure(response)
    return response


def session_of(request: web.Request) -> Session | None:
    """The request's valid session: signed, unexpired, and its key still active."""
    session = request.app[SESSIONS].verify(request.cookies.get(COOKIE))
    if session is None or session.key_id is None:
        return session
    store = request.app[keys.STATE].tenancy.authenticator.store
    record = store.records().get(session.key_id) if store is not None else None
    return session if record is not None and record.revoked_at is None and "admin" in record.scopes else None


async def login_page(request: web.Request) -> web.Response:
    if session_of(request) is not None:
        return _redirect("/admin/ui/now")
    return html(pages.login())


async def login(request: web.Request) -> web.Response:
    limiter, address = request.app[LIMITER], request.remote or "unknown"
    wait = limiter.wait_s(address)
    if wait > 0:                 # checked before the form is even read: the cheap refusal first
        return html(pages.login(f"Too many failed sign-ins; try again in {math.ceil(wait)} s."), status=429,
                    headers={"Retry-After": str(math.ceil(wait))})
    form = await _form(request)
    if form is None:
        return html(pages.login("The form was too large."), status=413)
    authenticator = request.app[keys.STATE].tenancy.authenticator
    try:
        principal = authenticator.authenticate(f"Bearer {form.get('key', '')}", "admin")
    except InsufficientScope:
        limiter.failed(address)
        return html(pages.login("That key lacks the admin scope."), status=403)
    except AuthError:
        limiter.failed(address)
        return html(pages.login("That key is not valid."), status=401)
    token = request.app[SESSIONS].issue(principal.key_id, principal.tenant)
    response = _redirect("/admin/ui/now")
    response.set_cookie(COOKIE, token, max_age=int(request.app[SESSIONS].ttl_s), path="/admin/ui", httponly=True,
                        samesite="Strict", secure=request.secure)
    return response


async def logout(request: web.Request) -> web.Response:
    session = session_of(request)
    form = await _form(request)
    if session is None or form is None or not request.app[SESSIONS].use_form_token(session, form.get("csrf")):
        return html(pages.login("Sign in again."), status=403)
    response = _redirect("/admin/ui/login")
    response.del_cookie(COOKIE, path="/admin/ui")
    return response


def view(render):
    """A GET view: the sign-in page without a session, else the view's page."""
    async def handler(request: web.Request) -> web.Response:
        session = session_of(request)
        if session is None:
            return html(pages.login(), status=401)
        return html(await render(request, session, request.app[SESSIONS]))
    return handler


def change(apply):
    """A POST that changes something: a session and one of its unused form tokens, or 403."""
    async def handler(request: web.Request) -> web.Response:
        session = session_of(request)
        form = await _form(request)
        if session is None or form is None or not request.app[SESSIONS].use_form_token(session, form.get("csrf")):
            return html(pages.page("Refused", "<p>This form was not made for your session, or was already "
                                              "sent. Open the page again.</p>"), status=403)
        return html(await apply(request, session, request.app[SESSIONS], form))
    return handler


async def _form(request: web.Request) -> dict[str, str] | None:
    """A urlencoded form of at most MAX_FORM_BYTES (read with a timeout), or None."""
    if request.content_length is not None and request.content_length > MAX_FORM_BYTES:
        return None
    try:
        body = await asyncio.wait_for(request.content.read(MAX_FORM_BYTES + 1), 10.0)
    except asyncio.TimeoutError:
        return None
    if len(body) > MAX_FORM_BYTES:
        return None
    return dict(parse_qsl(body.decode("utf-8", "replace"), max_num_fields=32))


async def static_file(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise web.HTTPNotFound()
    response = web.Response(body=(STATIC / name).read_bytes(), content_type=STATIC_FILES[name])
    _secure(response, {"Cache-Control": "max-age=3600"})
    return response


def data(make):
    """A chart's JSON, for a signed-in session only (as its page)."""
    async def handler(request: web.Request) -> web.Response:
        session = session_of(request)
        if session is None:
            return html(pages.login(), status=401)
        response = web.json_response(await make(request, session, request.app[SESSIONS]))
        _secure(response)
        return response
    return handler


async def _series(request: web.Request) -> dict:
    """The Now view's 15 minutes of samples, for its charts."""
    return request.app[SAMPLES].as_json()


async def _sampling(app: web.Application):
    task = asyncio.get_running_loop().create_task(app[SAMPLES].run(app[keys.STATE]), name="console-samples")
    yield
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
