"""Screenshots of every console view at 1280 and 390 pixels wide, for docs/console.md (docs/console/*.png).

Starts `inferd serve` on a sim model with two versions (one rolled back, with a reason), a tenant that made
requests and an admin key; signs in with headless Chromium (Debian's chromium and chromium-driver, through
Selenium) and saves one PNG per view and width. Bounded: about 20 s.

    .venv/bin/python bench/console_screenshots.py [--out docs/console]
"""
from __future__ import annotations

import argparse
import base64
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from daemon_process import create_key, serve_config, stop  # noqa: E402

VIEWS = ("now", "tenants", "slos", "models", "cluster", "jobs", "keys")
WIDTHS = (1280, 390)
CONFIG = """[server]
port = 0
[auth]
mode = "api_key"
[models.chat]
backend = "sim"
version = "v1"
versions = ["v2"]
max_batch_size = 8
[models.chat.sim]
profile = "llama3-8b-h100"
time_scale = 0.2
[prices.chat]
prompt_per_1k = 0.0005
completion_per_1k = 0.0015
[slos.chat-ttft]
model = "chat"
sli = "ttft"
threshold_ms = 500
objective = 0.99
"""


def post(url: str, key: str, body: dict) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()
        return resp.status


def stage(url: str, admin: str, user: str) -> None:
    """Traffic and a rolled-back canary, so the views have something to show."""
    for i in range(6):
        post(url + "/v1/chat/completions", user, {"model": "chat", "max_tokens": 16 + 8 * i,
                                                  "messages": [{"role": "user", "content": f"hello {i}"}]})
    post(url + "/admin/rollouts/chat/start", admin, {"stable": "chat@v1", "candidate": "chat@v2", "steps": [0.05, 1]})
    post(url + "/admin/rollouts/chat/rollback", admin, {"reason": "candidate TTFT p95 1.4x stable's"})


def shoot(url: str, admin: str, out: Path) -> list[Path]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = Options()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    saved = []
    try:
        driver.set_window_size(1280, 900)
        driver.get(url + "/admin/ui/login")
        driver.find_element(By.ID, "key").send_keys(admin)
        driver.find_element(By.CSS_SELECTOR, "form[action='/admin/ui/login'] button").click()
        time.sleep(0.5)
        for width in WIDTHS:
            # the viewport itself (not the window, whose frame differs by platform), a phone's at 390
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": 800, "deviceScaleFactor": 1, "mobile": width < 500})
            for view in VIEWS:
                driver.get(f"{url}/admin/ui/{view}")
                time.sleep(0.4 if view != "now" else 1.2)          # the Now view's chart draws after load
                shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png",
                                                                         "captureBeyondViewport": True})
                path = out / f"{view}-{width}.png"
                path.write_bytes(base64.b64decode(shot["data"]))    # the whole page, not just the viewport
                saved.append(path)
    finally:
        driver.quit()
    return saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "console")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="inferd-console-shots-") as tmp:
        work = Path(tmp)
        config = work / "inferd.toml"
        config.write_text(CONFIG)
        admin = create_key(config, "ops", "admin", cwd=work)
        user = create_key(config, "acme", cwd=work)
        proc, port, _ = serve_config(config, work, 60.0, "console")
        try:
            url = f"http://127.0.0.1:{port}"
            stage(url, admin, user)
            time.sleep(11)                  # a second sample for the Now view's chart (one every 10 s)
            for path in shoot(url, admin, args.out):
                print(f"screenshot: {path}")
        finally:
            stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
