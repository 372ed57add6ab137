"""A PostgreSQL outage under a serving daemon: how fast /readyz and the requests in flight notice it.

    .venv/bin/python bench/store_outage.py [--outages 2] [--outage-s 20] [--in-flight 4] [--mode sigstop|stop]

Starts a throwaway PostgreSQL server (as the tests do) and one daemon in this process (sim engine,
PostgreSQL store, the default [store] settings, auth off). Each outage: --in-flight completions are
started (each ~2 s of generation, X-Request-Timeout 60 s), and once they run the server is stopped:
`sigstop` stops every server process (no RST: what a partitioned server looks like), `stop` shuts it
down (`pg_ctl stop -m immediate`: connections are reset). /readyz is probed every 0.2 s. After
--outage-s the server resumes (SIGCONT, or started again on the same port). Prints, over all outages:
  time to readyz 503: <median> s        (from the stop to the first 503)
  in-flight request 503 after: <max> s  (from the stop to the in-flight requests' answers; their statuses)
  readyz 200 during outage: <pct> %     (of the probes between the stop and the resume)
  time to readyz 200 after resume: <median> s
Loopback only; every wait is bounded; the server is resumed and removed on the way out.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inferd.config.root import load_config  # noqa: E402
from tests.daemon.harness import running_daemon, sim_model, write_config  # noqa: E402
from tests.pg_server import PgServer, script_server  # noqa: E402
from tests.store.test_health import pause, resume, signal_server  # noqa: E402

BODY = {"model": "sim", "prompt": "hello there", "max_tokens": 5, "temperature": 0}
SLOW = {**BODY, "max_tokens": 800, "ignore_eos": True}
HEADERS = {"X-Request-Timeout": "60"}


async def probe(http: aiohttp.ClientSession, url: str, log: list[tuple[float, int]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            async with http.get(url + "/readyz", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                log.append((time.monotonic(), resp.status))
        except (aiohttp.ClientError, asyncio.TimeoutError):
            log.append((time.monotonic(), 0))
        await asyncio.sleep(0.2)


async def timed_post(http: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    async with http.post(url + "/v1/completions", json=SLOW, headers=HEADERS) as resp:
        await resp.read()
        return time.monotonic(), resp.status


async def one_outage(args, server: PgServer, daemon, http: aiohttp.ClientSession, url: str) -> dict:
    log: list[tuple[float, int]] = []
    stop = asyncio.Event()
    prober = asyncio.ensure_future(probe(http, url, log, stop))
    flights = [asyncio.ensure_future(timed_post(http, url)) for _ in range(args.in_flight)]
    for _ in range(500):
        if daemon.state.in_flight >= args.in_flight:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)                        # generating, not settling
    t0 = time.monotonic()
    pause(server, args.mode)
    await asyncio.wait(flights, timeout=args.outage_s)     # not cancelled: one that hangs ends after the resume
    await asyncio.sleep(max(0.0, t0 + args.outage_s - time.monotonic()))
    resumed = time.monotonic()
    resume(server, args.mode)
    await asyncio.wait(flights, timeout=120)
    done = [f.result() if f.done() else (time.monotonic(), 0) for f in flights]
    for _ in range(600):
        if log and log[-1][0] > resumed and log[-1][1] == 200:
            break
        await asyncio.sleep(0.1)
    stop.set()
    await prober
    during = [s for t, s in log if t0 <= t < resumed]
    first_503 = next((t for t, s in log if t >= t0 and s == 503), None)
    back = next((t for t, s in log if t >= resumed and s == 200), None)
    return {"to_503": None if first_503 is None else first_503 - t0,
            "in_flight": [(t - t0, s) for t, s in done], "ready_pct": 100 * during.count(200) / max(1, len(during)),
            "to_200": None if back is None else back - resumed}


def fmt(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    return f"{statistics.median(got):.2f}" if got else "never"


async def main(args: argparse.Namespace) -> None:
    with script_server() as server:
        try:
            dsn = server.create_database()
            with tempfile.TemporaryDirectory() as tmp:
                config = load_config(write_config(Path(tmp) / "inferd.toml", {"sim": sim_model(time_scale=1.0)},
                                                  f'[store]\nbackend = "postgres"\ndsn = "{dsn}"\n'))
                async with running_daemon(config) as (daemon, _, url), aiohttp.ClientSession() as http:
                    results = [await one_outage(args, server, daemon, http, url) for _ in range(args.outages)]
        finally:
            signal_server(server, signal.SIGCONT) if args.mode == "sigstop" else None
    flights = [f for r in results for f in r["in_flight"]]
    print(f"mode: {args.mode}, outages: {args.outages} x {args.outage_s:g} s, in flight each: {args.in_flight}")
    print(f"time to readyz 503: {fmt([r['to_503'] for r in results])} s")
    print(f"in-flight request 503 after: {max(t for t, _ in flights):.2f} s "
          f"(statuses {dict(Counter(s for _, s in flights))})")
    print(f"readyz 200 during outage: {statistics.mean(r['ready_pct'] for r in results):.0f} %")
    print(f"time to readyz 200 after resume: {fmt([r['to_200'] for r in results])} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", type=int, default=2)
    parser.add_argument("--outage-s", type=float, default=20.0)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--mode", choices=("sigstop", "stop"), default="sigstop")
    asyncio.run(main(parser.parse_args()))
