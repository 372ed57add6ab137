"""SLOs under overload: does the page alert fire within what the rules promise, and does degradation
keep the interactive SLO while refusals fall?

One daemon (a real Daemon in this process: config, auth, admission, SLO tracker) serves a simulated
Llama-3-8B on an H100 (`llama3-8b-h100`, real time) with a small batch, to two tenants: `ui`
(interactive, streams, TTFT SLO 1 s at 99%) and `bulk` (batch class). After a clean phase, `bulk`
offers several times the engine's capacity: admission sheds it (503), which burns the availability
SLO (objective 99.9%).

The alert check is Prometheus's own: the run's inferd_slo_events_total, sampled every STEP_S, is
prefixed with an hour of clean history at the clean phase's rate (as if the node had served cleanly
before) and given to `promtool test rules` with the rules `inferd monitoring rules` writes; the first
evaluation at which InferdSloBurnRatePage fires is compared with the promise of a 1h/5m 14.4x rule:
sustained at error ratio e, the 1-hour ratio crosses 14.4 x budget after 3600 s x 14.4 x budget / e.

The same overload then runs again with `[degrade.llama]` sending the batch class, max_tokens capped,
to a second, smaller engine while more than half of llama's batch slots are busy; the interactive
SLO and the refusals of both runs are compared.

    python bench/slo.py [--clean-s 20] [--overload-s 90]
Needs promtool (Debian: apt-get install prometheus) for the alert part. Loopback only; bounded.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from inferd.slo.rules import render_rules
from inferd.tenancy.keys import KeyHasher, create_key

from in_process import daemon_in_process  # noqa: E402 (bench/ is this script's own directory)

STEP_S = 2
CONFIG = """
[server]
port = 0
log_level = "error"
request_timeout_s = 60
state_dir = "{state}"
[auth]
mode = "api_key"
keys_file = "{state}/keys.jsonl"
[admission]
max_queued_requests = 64
batch_ttl_s = 4
[models.llama]
backend = "sim"
max_batch_size = 24
max_num_tokens = 4096
[models.llama.sim]
profile = "llama3-8b-h100"
time_scale = 1.0
[tenants.ui]
priority = "interactive"
max_concurrent_requests = 512
[tenants.default]
priority = "batch"
max_concurrent_requests = 256
[slos.ui-ttft]
model = "llama"
sli = "ttft"
priority = "interactive"
threshold_ms = 1000
objective = 0.99
[slos.availability]
model = "llama"
sli = "availability"
objective = 0.999
"""
# The degraded run also serves `llama-lite` (a second, smaller engine: the fp8 profile with a wider
# batch) and sends the batch class there, capped at 96 tokens, while over half of llama's batch is busy.
DEGRADE = """
[models.llama-lite]
backend = "sim"
max_batch_size = 96
max_num_tokens = 8192
[models.llama-lite.sim]
profile = "llama3-8b-h100-fp8"
time_scale = 1.0
[degrade.llama]
batch_fill_over = 0.5
max_tokens = { batch = 96 }
route = { batch = "llama-lite" }
"""
BULK_TENANTS = 16     # many tenants: none floods alone, so admission sheds with 503 (not the flooder's 429)


async def one(http, url, key, body, ttfts=None) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    start = time.monotonic()
    try:
        async with http.post(url + "/v1/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                return resp.status
            async for _ in resp.content:
                if ttfts is not None:
                    ttfts.append(time.monotonic() - start)
                    ttfts = None
            return 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return 599


async def offer(http, url, keys, rate, seconds, body, rng, results, ttfts=None) -> None:
    """Poisson arrivals at `rate`/s for `seconds`, each from one of `keys`; statuses into `results`."""
    end = time.monotonic() + seconds
    tasks = []
    while (now := time.monotonic()) < end:
        tasks.append(asyncio.ensure_future(one(http, url, rng.choice(keys), body, ttfts)))
        await asyncio.sleep(min(rng.expovariate(rate), end - now))
    results.extend(await asyncio.gather(*tasks))


async def run(args, degrade: bool) -> dict:
    keys: dict[str, list[str]] = {}

    def make_keys(state: Path) -> None:
        keys["ui"] = [create_key(state / "keys.jsonl", KeyHasher(None), "ui")[1]]
        keys["bulk"] = [create_key(state / "keys.jsonl", KeyHasher(None), f"bulk-{i:02d}")[1]
                        for i in range(BULK_TENANTS)]

    def config_text(state: Path) -> str:
        return CONFIG.format(state=state) + (DEGRADE if degrade else "")

    async with daemon_in_process(config_text, "inferd-slo-bench-", prepare=make_keys) as (daemon, url, _):
        config = daemon.state.config
        rng = random.Random(1)
        ui = {"model": "llama", "prompt": "hello " * 200, "max_tokens": 128, "stream": True, "ignore_eos": True}
        bulk = {"model": "llama", "prompt": "data " * 500, "max_tokens": 400, "ignore_eos": True}
        samples: list[tuple[float, int, int]] = []       # (t, good, bad) of the availability SLO
        t0 = time.monotonic()

        async def sample() -> None:
            while True:
                snap = {s.name: s for s in daemon.state.slos.snapshot()}["availability"]
                samples.append((time.monotonic() - t0, snap.good, snap.bad))
                await asyncio.sleep(STEP_S)

        sampler = asyncio.ensure_future(sample())
        ui_status, ui_ttft, bulk_status = [], [], []
        conn = aiohttp.TCPConnector(limit=4096)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=90)) as http:
            ui_load = asyncio.ensure_future(offer(http, url, keys["ui"], 2.0, args.clean_s + args.overload_s, ui,
                                                  rng, ui_status, ui_ttft))
            await offer(http, url, keys["bulk"], 2.0, args.clean_s, bulk, rng, [])
            overload_at = time.monotonic() - t0
            ui_before = len(ui_ttft)
            await offer(http, url, keys["bulk"], args.bulk_rate, args.overload_s, bulk, rng, bulk_status)
            await ui_load
        sampler.cancel()
        snap = {s.name: s for s in daemon.state.slos.snapshot()}
    ttft = sorted(ui_ttft[ui_before:])
    return {"samples": samples, "overload_at": overload_at, "slos": snap, "config": config,
            "ttft_p99": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))] if ttft else float("nan"),
            "ttft_good": sum(t <= 1.0 for t in ttft) / len(ttft) if ttft else float("nan"),
            "refused": sum(s != 200 for s in bulk_status), "bulk": len(bulk_status),
            "statuses": {str(k): bulk_status.count(k) for k in sorted(set(bulk_status))}}


def page_time(result: dict) -> tuple[float | None, float, float]:
    """(seconds from overload to the first firing of the page alert per promtool, the promise, error ratio)."""
    samples, at = result["samples"], result["overload_at"]
    clean = [s for s in samples if s[0] <= at]
    rate = (clean[-1][1] - clean[0][1]) / max(1, len(clean) - 1) if len(clean) > 1 else 1.0
    history = 3600 // STEP_S
    good = f"0+{rate:g}x{history} " + " ".join(f"{history * rate + g:g}" for _, g, _ in samples)
    bad = f"0+0x{history} " + " ".join(str(b) for _, _, b in samples)
    after = [s for s in samples if s[0] > at]
    g0, b0 = next(((g, b) for t, g, b in samples if t >= at), (0, 0))
    err = (after[-1][2] - b0) / max(1, (after[-1][1] - g0) + (after[-1][2] - b0)) if after else 0.0
    budget = 1 - result["config"].slos["availability"].objective
    promise = 3600 * 14.4 * budget / err if err else float("inf")
    work = Path(tempfile.mkdtemp(prefix="inferd-slo-promtool-"))
    (work / "rules.yml").write_text(render_rules(result["config"].slos))
    series = 'inferd_slo_events_total{slo="availability",model="llama",sli="availability",result="%s"}'
    times = [history * STEP_S + int(t) for t, _, _ in after]
    test = {"rule_files": ["rules.yml"], "evaluation_interval": f"{STEP_S}s", "tests": [{
        "interval": f"{STEP_S}s", "input_series": [{"series": series % "good", "values": good},
                                                   {"series": series % "bad", "values": bad}],
        "alert_rule_test": [{"eval_time": f"{t}s", "alertname": "InferdSloBurnRatePage", "exp_alerts": []}
                            for t in times]}]}
    (work / "test.yml").write_text(json.dumps(test))
    done = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=work, capture_output=True, text=True,
                          timeout=300)
    out = done.stdout + done.stderr         # promtool reports failed expectations (here: firings) on stderr
    fired = [_seconds(m) for m in re.findall(r"alertname: InferdSloBurnRatePage, time: ([0-9hms.]+)", out)]
    first = min(fired) - history * STEP_S - at if fired else None
    return first, promise, err


def _seconds(text: str) -> float:
    total = 0.0
    for value, unit in re.findall(r"([0-9.]+)([hms])", text):
        total += float(value) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


async def main(args) -> None:
    plain = await run(args, degrade=False)
    if shutil.which("promtool"):
        first, promise, err = page_time(plain)
        print(f"overload: {err:.0%} of availability events bad (budget 0.1%); a 1h/5m 14.4x page is promised "
              f"within {promise:.0f} s at a steady request rate (more requests during the overload: sooner)")
        print(f"page alert (promtool, rules of `inferd monitoring rules`): "
              f"{'fires %.0f s after the overload began' % first if first is not None else 'did not fire'}")
    else:
        print("page alert: skipped (promtool not installed; Debian: apt-get install prometheus)")
    degraded = await run(args, degrade=True)
    for name, r in (("without degradation", plain), ("with [degrade.llama]", degraded)):
        slo = r["slos"]["ui-ttft"]
        print(f"{name}: interactive TTFT within 1 s {r['ttft_good']:.1%} (SLO 99%), p99 {r['ttft_p99']:.2f} s, "
              f"SLO events good/bad {slo.good}/{slo.bad}; bulk refused {r['refused']} of {r['bulk']} "
              f"({r['refused'] / max(1, r['bulk']):.0%}; statuses {r['statuses']}); availability SLO good/bad "
              f"{r['slos']['availability'].good}/{r['slos']['availability'].bad}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clean-s", type=float, default=20.0)
    parser.add_argument("--overload-s", type=float, default=90.0)
    parser.add_argument("--bulk-rate", type=float, default=30.0, help="bulk requests/s during the overload")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
