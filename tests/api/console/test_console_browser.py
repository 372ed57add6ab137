"""The console in a real browser: headless Chromium driven by Selenium against the real daemon. Sign in, see
the engines, a tenant's usage (and its chart) and a rollout's rollback reason, create and revoke a key, sign
out; pages that need a session show the sign-in page."""
from __future__ import annotations

import asyncio
import shutil

import pytest

import aiohttp

from inferd.config.root import parse_config
from inferd.tenancy.keys import KeyHasher, create_key
from tests.api.console.test_console import SIM
from tests.daemon.harness import running_daemon

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="Debian's chromium and chromium-driver are not installed (.ci/run installs them)")


@pytest.fixture(autouse=True)
def quick_samples(monkeypatch):
    """A sample every 0.2 s, so the Now view has a chart to draw within the test (the daemon: every 10 s)."""
    monkeypatch.setattr("inferd.api.console.samples.INTERVAL_S", 0.2)


def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(DRIVER), options=options)


@pytest.fixture
async def staged(tmp_path):
    """A daemon with two versions of `sim`, a tenant's traffic and a canary rolled back with a reason."""
    keys_file = tmp_path / "keys.jsonl"
    admin = create_key(keys_file, KeyHasher(None), "ops", ("admin",))[1]
    user = create_key(keys_file, KeyHasher(None), "acme", ("inference",))[1]
    cfg = parse_config({"server": {"port": 0}, "models": {"sim": {**SIM, "version": "v1", "versions": ["v2"]}},
                        "auth": {"mode": "api_key", "keys_file": "keys.jsonl"}, "audit": {"path": "audit.jsonl"}},
                       base_dir=tmp_path)
    async with running_daemon(cfg) as (_, _, url), aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 5},
                                 headers={"Authorization": f"Bearer {user}"}) as resp:
                assert resp.status == 200
        auth = {"Authorization": f"Bearer {admin}"}
        for action, body in (("start", {"stable": "sim@v1", "candidate": "sim@v2", "steps": [0.1, 1.0]}),
                             ("rollback", {"reason": "canary errors doubled"})):
            async with http.post(f"{url}/admin/rollouts/sim/{action}", headers=auth, json=body) as resp:
                assert resp.status == 200, await resp.text()
        yield url, admin


def session_walk(url: str, admin: str) -> dict:
    """Everything a person does in one sitting, in the browser (blocking: run off the event loop)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    seen = {}
    driver = browser()

    def find(css: str):
        """The element once the page that has it has loaded (a click's navigation may still be on its way)."""
        return WebDriverWait(driver, 15).until(ready.presence_of_element_located((By.CSS_SELECTOR, css)))

    def heading_is(text: str) -> str:
        WebDriverWait(driver, 15).until(ready.text_to_be_present_in_element((By.TAG_NAME, "h2"), text))
        return driver.find_element(By.TAG_NAME, "h2").text

    try:
        driver.get(url + "/admin/ui/keys")
        seen["without_session"] = driver.find_element(By.TAG_NAME, "h2").text
        driver.find_element(By.ID, "key").send_keys(admin)
        driver.find_element(By.CSS_SELECTOR, "form[action='/admin/ui/login'] button").click()
        heading_is("Now")
        seen["after_sign_in"] = (driver.current_url, driver.find_element(By.TAG_NAME, "main").text)
        # console.js and uPlot ran (the CSP lets the daemon's own scripts in): the chart is drawn, a canvas
        driver.refresh()
        find(".spark canvas")
        seen["htmx"] = driver.execute_script("return typeof htmx !== 'undefined' && typeof uPlot !== 'undefined'")
        driver.find_element(By.LINK_TEXT, "Tenants").click()
        seen["tenant_row"] = find("tbody tr").text
        find(".daily canvas")                      # the daily usage chart, drawn by uPlot
        driver.find_element(By.LINK_TEXT, "Models").click()
        heading_is("Models")
        seen["models"] = driver.find_element(By.TAG_NAME, "main").text
        driver.find_element(By.LINK_TEXT, "Keys").click()
        find("#tenant").send_keys("browser-made")
        find("form[action='/admin/ui/keys'] button").click()
        seen["created"] = find("output.secret").text
        row = next(r for r in driver.find_elements(By.CSS_SELECTOR, "tbody tr") if "browser-made" in r.text)
        row.find_element(By.TAG_NAME, "button").click()
        WebDriverWait(driver, 15).until(ready.text_to_be_present_in_element((By.TAG_NAME, "main"), "Revoked "))
        seen["revoked"] = find("p[role=status]").text
        find("nav form button").click()
        seen["signed_out"] = heading_is("Sign in")
        driver.get(url + "/admin/ui/now")
        seen["after_sign_out"] = heading_is("Sign in")
        seen["blocked"] = [e["message"] for e in driver.get_log("browser")
                           if "Content Security Policy" in e["message"] or "Refused to" in e["message"]]
    finally:
        driver.quit()
    return seen


async def test_a_person_signs_in_sees_usage_and_a_rollback_makes_and_revokes_a_key_and_signs_out(staged):
    url, admin = staged
    seen = await asyncio.wait_for(asyncio.to_thread(session_walk, url, admin), 120)
    assert seen["without_session"] == "Sign in"
    assert seen["after_sign_in"][0].endswith("/admin/ui/now") and "sim" in seen["after_sign_in"][1]
    assert seen["htmx"] is True
    assert seen["tenant_row"].startswith("acme") and "3 requests" in seen["tenant_row"]
    assert "rolled_back" in seen["models"] and "canary errors doubled" in seen["models"]
    assert len(seen["created"]) > 20
    assert seen["revoked"].startswith("Revoked ")
    assert seen["signed_out"] == "Sign in" and seen["after_sign_out"] == "Sign in"
    # the CSP blocks nothing the pages need: no refused script, style or form in the browser's console
    assert seen["blocked"] == [], seen["blocked"]
