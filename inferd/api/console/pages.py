"""The console's HTML: server-rendered pages that read without JavaScript (no inline script or style: the
Content-Security-Policy forbids both), every value escaped, numbers with their units.
"""
from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence

VIEWS = (("now", "Now"), ("tenants", "Tenants"), ("slos", "SLOs"), ("models", "Models"), ("cluster", "Cluster"),
         ("jobs", "Jobs"), ("keys", "Keys"))
STYLESHEET = "/admin/ui/static/console.css"
# htmx must not add its indicator <style> (the CSP allows no inline style) nor evaluate attributes.
HEAD = ('<meta name="htmx-config" content=\'{"includeIndicatorStyles": false, "allowEval": false, '
        '"allowScriptTags": false}\'>'
        f'<link rel="stylesheet" href="{STYLESHEET}">'
        '<link rel="stylesheet" href="/admin/ui/static/vendor/uPlot.min.css">'
        '<script src="/admin/ui/static/vendor/htmx.min.js" defer></script>'
        '<script src="/admin/ui/static/vendor/uPlot.iife.min.js" defer></script>'
        '<script src="/admin/ui/static/console.js" defer></script>')


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, body: str, *, view: str | None = None, logout_token: str | None = None,
         refresh_s: int | None = None) -> str:
    """A whole page: the navigation (when signed in), `body`, and a refresh every `refresh_s` seconds (a
    meta refresh: it needs no script)."""
    nav = ""
    if logout_token is not None:
        links = " ".join(f'<a href="/admin/ui/{name}"{" aria-current=page" if name == view else ""}>{label}</a>'
                         for name, label in VIEWS)
        nav = (f'<nav>{links}<form method="post" action="/admin/ui/logout">{hidden(logout_token)}'
               f'<button type="submit">Log out</button></form></nav>')
    # With JavaScript, htmx swaps the page's <main> every refresh_s (charts kept in step by console.js);
    # without it, the page reloads itself (a meta refresh inside <noscript>).
    refresh = f'<noscript><meta http-equiv="refresh" content="{int(refresh_s)}"></noscript>' if refresh_s else ""
    poll = (f' hx-get="/admin/ui/{view}" hx-trigger="every {int(refresh_s)}s" hx-select="main" hx-swap="outerHTML"'
            if refresh_s and view else "")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{refresh}{HEAD}'
            f'<title>{esc(title)} · inferd</title></head>'
            f'<body><header><h1>inferd</h1>{nav}</header><main{poll}><h2>{esc(title)}</h2>{body}</main></body></html>')


def hidden(token: str) -> str:
    return f'<input type="hidden" name="csrf" value="{esc(token)}">'


def login(error: str | None = None) -> str:
    message = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    return page("Sign in", f'{message}<form method="post" action="/admin/ui/login">'
                           f'<label for="key">Admin API key</label>'
                           f'<input id="key" name="key" type="password" autocomplete="off" required>'
                           f'<button type="submit">Sign in</button></form>'
                           f'<p>The key is checked once and never stored: the browser keeps a session of '
                           f'30 minutes instead.</p>')


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], empty: str = "None.") -> str:
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return f"<p>{esc(empty)}</p>"
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in headers)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def when(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def number(value: float, unit: str = "", digits: int = 0) -> str:
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip()


def percent(ratio: float) -> str:
    return f"{ratio:.0%}"
