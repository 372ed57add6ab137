"""The console (/admin/ui) through the real daemon: sign-in with an admin key, the session cookie, the CSP,
the views, keys created and revoked from a form, and forged or replayed forms refused."""
from __future__ import annotations

import re

import aiohttp
import pytest

from inferd.config.root import parse_config
from inferd.tenancy.keys import KeyHasher, create_key
from tests.daemon.harness import running_daemon, until

SIM = {"backend": "sim", "max_batch_size": 4, "sim": {"profile": "tiny", "time_scale": 0.0}}


@pytest.fixture
async def console(tmp_path):
    keys_file = tmp_path / "keys.jsonl"
    admin = create_key(keys_file, KeyHasher(None), "ops", ("admin",))[1]
    user = create_key(keys_file, KeyHasher(None), "acme", ("inference",))[1]
    cfg = parse_config({"server": {"port": 0}, "models": {"sim": SIM}, "auth": {"mode": "api_key",
                        "keys_file": "keys.jsonl"}, "audit": {"path": "audit.jsonl"}}, base_dir=tmp_path)
    async with running_daemon(cfg) as (daemon, _, url), aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        yield daemon, url, http, admin, user, tmp_path


async def sign_in(http, url: str, key: str) -> aiohttp.ClientResponse:
    async with http.post(url + "/admin/ui/login", data={"key": key}, allow_redirects=False) as resp:
        await resp.read()
        return resp


def csrf(text: str, action: str) -> str:
    """The form token of the form posting to `action` on a page."""
    form = re.search(r'<form method="post" action="' + re.escape(action) + r'">(.*?)</form>', text, re.S)
    return re.search(r'name="csrf" value="([^"]+)"', form.group(1)).group(1)


def no_inline_code(text: str) -> bool:
    """Every script is a file of the daemon's (a src, an empty body); no inline style or event handler."""
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", text, re.S)
    return (all('src="/admin/ui/static/' in attrs and not body.strip() for attrs, body in scripts)
            and " style=" not in text and not re.search(r"\son[a-z]+=", text))


async def get(http, url: str, path: str) -> tuple[int, str, dict]:
    async with http.get(url + path, allow_redirects=False) as resp:
        return resp.status, await resp.text(), dict(resp.headers)


async def test_without_a_session_every_view_is_the_sign_in_page_and_a_bad_key_is_refused(console):
    _, url, http, _, user, _ = console
    for path in ("/admin/ui/now", "/admin/ui/keys"):
        status, text, headers = await get(http, url, path)
        assert status == 401 and "Admin API key" in text
        assert "script-src 'self'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
    assert (await sign_in(http, url, "nope")).status == 401
    assert (await sign_in(http, url, user)).status == 403          # a key without the admin scope
    assert not http.cookie_jar.filter_cookies(url + "/admin/ui")


async def test_signing_in_sets_an_httponly_strict_cookie_that_is_not_the_key_and_shows_the_engines(console):
    _, url, http, admin, _, _ = console
    resp = await sign_in(http, url, admin)
    assert resp.status == 303 and resp.headers["Location"] == "/admin/ui/now"
    cookie = resp.cookies["inferd_console"]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and not cookie["secure"]      # plain HTTP here
    assert admin not in cookie.value and cookie["path"] == "/admin/ui"
    status, text, headers = await get(http, url, "/admin/ui/now")
    assert status == 200 and "<td>sim</td>" in text and "tokens/s" in text
    assert no_inline_code(text) and headers["Cache-Control"] == "no-store"
    async with http.get(url + "/admin/ui/static/console.css") as css:
        assert css.status == 200 and css.content_type == "text/css"


async def test_a_key_is_created_shown_once_and_revoked_from_the_console_and_audited(console):
    daemon, url, http, admin, _, tmp_path = console
    await sign_in(http, url, admin)
    _, page, _ = await get(http, url, "/admin/ui/keys")
    async with http.post(url + "/admin/ui/keys", data={"csrf": csrf(page, "/admin/ui/keys"), "tenant": "beta",
                                                       "scope_inference": "1"}) as resp:
        text = await resp.text()
    assert resp.status == 200 and "shown only now" in text
    key = re.search(r'<output class="secret">([^<]+)</output>', text).group(1)
    async with http.post(url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 2},
                         headers={"Authorization": f"Bearer {key}"}) as resp:
        assert resp.status == 200                           # in effect at once
    key_id = re.search(r"Key <code>([^<]+)</code>", text).group(1)
    _, page, _ = await get(http, url, "/admin/ui/keys")
    assert key not in page                                  # shown once: never again
    action = f"/admin/ui/keys/{key_id}/revoke"
    async with http.post(url + action, data={"csrf": csrf(page, action)}) as resp:
        assert resp.status == 200 and f"Revoked {key_id}" in await resp.text()
    async with http.post(url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 2},
                         headers={"Authorization": f"Bearer {key}"}) as resp:
        assert resp.status == 401
    audit = tmp_path / "audit.jsonl"

    async def both_recorded() -> bool:          # the audit log is written off the loop: wait for the line
        text = audit.read_text() if audit.exists() else ""
        return '"key.create"' in text and '"key.revoke"' in text
    await until(both_recorded, "the console's key.create and key.revoke in the audit log")
    assert "console: created by" in audit.read_text() and "console: revoked by" in audit.read_text()


async def test_a_forged_or_replayed_form_is_refused(console):
    _, url, http, admin, _, tmp_path = console
    await sign_in(http, url, admin)
    _, page, _ = await get(http, url, "/admin/ui/keys")
    token = csrf(page, "/admin/ui/keys")
    form = {"csrf": token, "tenant": "gamma", "scope_inference": "1"}
    async with http.post(url + "/admin/ui/keys", data=form) as resp:
        assert resp.status == 200
    async with http.post(url + "/admin/ui/keys", data=form) as resp:           # the same form again
        assert resp.status == 403
    async with http.post(url + "/admin/ui/keys", data={**form, "csrf": token[:-2] + "xx"}) as resp:
        assert resp.status == 403                                              # a token it did not make
    async with aiohttp.ClientSession() as stranger:                            # another browser, no session
        async with stranger.post(url + "/admin/ui/keys", data={**form, "csrf": csrf(page, "/admin/ui/keys")}) as r:
            assert r.status == 403
    assert (tmp_path / "keys.jsonl").read_text().count('"gamma"') == 1


async def test_signing_out_ends_the_session_and_revoking_its_key_ends_it_too(console):
    daemon, url, http, admin, _, tmp_path = console
    await sign_in(http, url, admin)
    _, page, _ = await get(http, url, "/admin/ui/now")
    async with http.post(url + "/admin/ui/logout", data={"csrf": csrf(page, "/admin/ui/logout")},
                         allow_redirects=False) as resp:
        assert resp.status == 303
    assert (await get(http, url, "/admin/ui/now"))[0] == 401
    await sign_in(http, url, admin)
    assert (await get(http, url, "/admin/ui/now"))[0] == 200
    from inferd.tenancy.keys import revoke_key
    from inferd.tenancy.keys_file import load_records

    admin_id = next(r.key_id for r in load_records(tmp_path / "keys.jsonl") if r.tenant == "ops")
    revoke_key(tmp_path / "keys.jsonl", admin_id)
    await daemon.state.tenancy.refresh_keys()
    assert (await get(http, url, "/admin/ui/now"))[0] == 401


async def test_an_oversized_sign_in_form_is_refused_unread(console):
    _, url, http, _, _, _ = console
    async with http.post(url + "/admin/ui/login", data={"key": "x" * 10000}) as resp:
        assert resp.status == 413


async def test_the_tenants_view_shows_a_tenants_usage_after_its_requests(console):
    _, url, http, admin, user, _ = console
    for _ in range(2):
        async with http.post(url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 3},
                             headers={"Authorization": f"Bearer {user}"}) as resp:
            assert resp.status == 200
    async with http.post(url + "/v1/completions", json={"model": "nope", "prompt": "hi"},
                         headers={"Authorization": "Bearer wrong"}) as resp:
        assert resp.status == 401
    await sign_in(http, url, admin)
    status, text, _ = await get(http, url, "/admin/ui/tenants")
    assert status == 200
    row = re.search(r"<tr><td>acme</td><td>([^<]+)</td><td>([^<]+)</td></tr>", text)
    assert row and row.group(1).startswith("2 requests") and row.group(2).startswith("2 requests"), text
    assert "<h3>Quota now</h3>" in text and 'class="daily"' in text
    async with http.get(url + "/admin/ui/tenants/daily") as resp:
        daily = await resp.json()
    assert len(daily["days"]) == 30 and daily["tenants"]["acme"][-1] > 0 and sum(daily["tenants"]["acme"][:-1]) == 0


async def test_the_models_view_shows_routes_versions_and_a_rollouts_rollback_reason(tmp_path):
    keys_file = tmp_path / "keys.jsonl"
    admin = create_key(keys_file, KeyHasher(None), "ops", ("admin",))[1]
    cfg = parse_config({"server": {"port": 0}, "models": {"sim": {**SIM, "version": "v1", "versions": ["v2"]}},
                        "auth": {"mode": "api_key", "keys_file": "keys.jsonl"}, "audit": {"path": "audit.jsonl"}},
                       base_dir=tmp_path)
    async with running_daemon(cfg) as (_, _, url), aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        auth = {"Authorization": f"Bearer {admin}"}
        async with http.post(url + "/admin/rollouts/sim/start", headers=auth,
                             json={"stable": "sim@v1", "candidate": "sim@v2", "steps": [0.1, 1.0]}) as resp:
            assert resp.status == 200, await resp.text()
        async with http.post(url + "/admin/rollouts/sim/rollback", headers=auth,
                             json={"reason": "p95 TTFT doubled on the canary"}) as resp:
            assert resp.status == 200, await resp.text()
        await sign_in(http, url, admin)
        status, text, _ = await get(http, url, "/admin/ui/models")
    assert status == 200
    assert "<td>sim@v1</td>" in text and "<td>sim@v2</td>" in text
    assert "p95 TTFT doubled on the canary" in text and "rolled_back" in text.replace("-", "_"), text


async def test_every_view_renders_for_a_signed_in_admin_with_units_and_no_script(console):
    _, url, http, admin, _, _ = console
    await sign_in(http, url, admin)
    for view, expected in (("now", "tokens/s"), ("tenants", "Refused before admission"),
                           ("slos", "No [slos.*] configured"),
                           ("models", "<td>sim</td>"), ("cluster", "not in a cluster"), ("jobs", "No batch jobs"),
                           ("keys", "ops")):
        status, text, _ = await get(http, url, f"/admin/ui/{view}")
        assert status == 200 and expected in text, (view, text[-800:])
        assert no_inline_code(text)
        assert f'href="/admin/ui/{view}" aria-current=page' in text


def test_an_slo_is_alerting_when_both_windows_of_a_pair_burn_faster_than_its_factor():
    from inferd.api.console.ops_views import _alerting

    assert _alerting({"1h": 20.0, "5m": 30.0}) == "page (1h/5m over 14.4x)"
    assert _alerting({"1h": 20.0, "5m": 1.0, "6h": 7.0, "30m": 8.0}) == "ticket (6h/30m over 6x)"
    assert _alerting({"3d": 0.5, "6h": 0.5}) == "-"


async def test_the_now_views_history_needs_a_session_and_only_shipped_files_are_served(console):
    daemon, url, http, admin, _, _ = console
    assert (await get(http, url, "/admin/ui/now/series"))[0] == 401
    await sign_in(http, url, admin)
    async with http.get(url + "/admin/ui/now/series") as resp:
        series = await resp.json()
    # the sampler takes its first sample as the app starts, then one every 10 s
    assert set(series["sim"]) == {"t", "fill", "kv", "queued", "tokens_per_s"} and len(series["sim"]["t"]) >= 1
    for name, kind in (("vendor/htmx.min.js", "text/javascript"), ("vendor/uPlot.iife.min.js", "text/javascript"),
                       ("console.js", "text/javascript"), ("vendor/uPlot.min.css", "text/css")):
        async with http.get(url + "/admin/ui/static/" + name) as resp:
            assert resp.status == 200 and resp.content_type == kind
    for name in ("vendor/VERSIONS", "../session.py", "vendor/LICENSE.htmx"):
        async with http.get(url + "/admin/ui/static/" + name) as resp:
            assert resp.status == 404


async def test_repeated_failed_sign_ins_from_one_address_wait_and_say_how_long(console):
    _, url, http, admin, _, _ = console
    for _ in range(10):
        assert (await sign_in(http, url, "guess")).status == 401
    resp = await sign_in(http, url, admin)          # even the right key waits its turn now
    assert resp.status == 429 and 0 < int(resp.headers["Retry-After"]) <= 60


def test_the_sign_in_limit_forgets_failures_older_than_its_window():
    from inferd.api.console.session import SignInLimiter

    now = [0.0]
    limiter = SignInLimiter(clock=lambda: now[0])
    for _ in range(10):
        limiter.failed("a")
    assert limiter.wait_s("a") == 60.0 and limiter.wait_s("b") == 0.0
    now[0] = 61.0
    assert limiter.wait_s("a") == 0.0
