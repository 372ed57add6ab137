"""The console's Keys view: the keys file's keys, creating one (shown once) and revoking one.

Changes go through the keys file as `inferd keys create|revoke` makes them (inferd.tenancy.keys), off the
event loop; the daemon then re-reads the file at once, which applies them and records them in the audit log
(key.create, key.revoke) as the CLI's are, with the console user's key id as the reason's author.
"""
from __future__ import annotations

import asyncio

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.console import pages
from inferd.tenancy import SCOPES, create_key, revoke_key


def _store(request: web.Request):
    return request.app[keys.STATE].tenancy.authenticator.store


async def render(request: web.Request, session, sessions, notice: str = "") -> str:
    store = _store(request)
    if store is None:
        return pages.page("Keys", '<p>auth.mode is "none": the API takes no keys.</p>', view="keys",
                          logout_token=sessions.form_token(session))
    rows = []
    for r in sorted(store.records().values(), key=lambda r: r.created_at):
        action = "revoked " + pages.when(r.revoked_at) if r.revoked_at is not None else (
            f'<form method="post" action="/admin/ui/keys/{pages.esc(r.key_id)}/revoke">'
            f'{pages.hidden(sessions.form_token(session))}<button type="submit">Revoke</button></form>')
        rows.append([pages.esc(r.key_id), pages.esc(r.tenant), pages.esc(", ".join(r.scopes)),
                     pages.when(r.created_at), action])
    scopes = "".join(f'<label><input type="checkbox" name="scope_{s}" value="1"'
                     f'{" checked" if s == "inference" else ""}>{s}</label>' for s in SCOPES)
    create = (f'<h3>New key</h3><form method="post" action="/admin/ui/keys">'
              f'{pages.hidden(sessions.form_token(session))}<label for="tenant">Tenant</label>'
              f'<input id="tenant" name="tenant" required maxlength="64">'
              f'<fieldset><legend>Scopes</legend>{scopes}</fieldset><button type="submit">Create</button></form>')
    body = notice + pages.table(("key id", "tenant", "scopes", "created", ""), rows, empty="No keys yet.") + create
    return pages.page("Keys", body, view="keys", logout_token=sessions.form_token(session))


async def create(request: web.Request, session, sessions, form: dict[str, str]) -> str:
    store = _store(request)
    tenant = form.get("tenant", "").strip()
    scopes = tuple(s for s in SCOPES if form.get(f"scope_{s}"))
    if store is None or not tenant or not scopes:
        notice = '<p class="error" role="alert">A key needs a tenant and at least one scope.</p>'
        return await render(request, session, sessions, notice)
    try:
        record, key = await asyncio.to_thread(create_key, store.path, store.hasher, tenant, scopes)
    except ValueError as exc:
        return await render(request, session, sessions, f'<p class="error" role="alert">{pages.esc(exc)}</p>')
    await request.app[keys.STATE].tenancy.refresh_keys(f"console: created by {session.key_id or session.tenant}")
    notice = (f'<p role="status">Key <code>{pages.esc(record.key_id)}</code> for tenant {pages.esc(tenant)}. It is '
              f'shown only now:</p><p><output class="secret">{pages.esc(key)}</output></p>')
    return await render(request, session, sessions, notice)


async def revoke(request: web.Request, session, sessions, form: dict[str, str]) -> str:
    store = _store(request)
    key_id = request.match_info["key_id"]
    try:
        if store is None:
            raise KeyError(key_id)
        await asyncio.to_thread(revoke_key, store.path, key_id)
    except KeyError:
        return await render(request, session, sessions,
                            f'<p class="error" role="alert">No key {pages.esc(key_id)}.</p>')
    await request.app[keys.STATE].tenancy.refresh_keys(f"console: revoked by {session.key_id or session.tenant}")
    return await render(request, session, sessions, f'<p role="status">Revoked {pages.esc(key_id)}.</p>')
