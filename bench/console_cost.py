"""What the console costs the daemon: bench/frontend.py's load (sim at zero step time, 256 streams) with and
without a signed-in operator polling every console view once a second, alternated in one sitting.

The poller fetches each view's HTML and the Now view's series, as a browser with every view open in a tab
would (the daemon's work is the same; a browser's rendering is the browser's). It runs beside the load
generator on the client CPU. The console's sampler (one sample every 10 s) runs in both.

    .venv/bin/python bench/console_cost.py [--rounds 2] [--seconds 8]

Prints `console cost, delivered tokens/s with/without: X` and `console cost, server CPU per token
with/without: X` (about 1.00 means nothing measurable).
"""
from __future__ import annotations

import argparse
import http.cookiejar
import statistics
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from daemon_process import pin, stop  # noqa: E402
from frontend import CLIENT_CPU, load_phase, start_server  # noqa: E402

VIEWS = ("now", "tenants", "slos", "models", "cluster", "jobs", "keys")


def poll_console(port: int, stop_event: threading.Event, counts: list[int]) -> None:
    """Sign in (auth is off in the bench's config: any key is the admin) and fetch every view each second."""
    pin(CLIENT_CPU)
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    base = f"http://127.0.0.1:{port}/admin/ui"
    opener.open(base + "/login", data=urllib.parse.urlencode({"key": "bench"}).encode(), timeout=10).read()
    while not stop_event.is_set():
        for path in [f"/{v}" for v in VIEWS] + ["/now/series"]:
            opener.open(base + path, timeout=10).read()
            counts[0] += 1
        stop_event.wait(1.0)


def one_run(args: argparse.Namespace, workdir: Path, with_console: bool) -> dict:
    proc, port = start_server("daemon", workdir, args)
    stop_event, counts = threading.Event(), [0]
    poller = threading.Thread(target=poll_console, args=(port, stop_event, counts), daemon=True)
    try:
        if with_console:
            poller.start()
        result = load_phase(proc, port, args)
    finally:
        stop_event.set()
        if poller.is_alive():
            poller.join(15)
        stop(proc, 15)
    result["console_fetches"] = counts[0]
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    args = p.parse_args()
    args.front_processes = 0
    runs: dict[str, list[dict]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for mode in (("without", "with") if i % 2 == 0 else ("with", "without")):
                r = one_run(args, Path(tmp), mode == "with")
                runs[mode].append(r)
                print(f"{mode} console, round {i + 1}: {r['tokens_per_s']:,.0f} delivered tokens/s, server CPU "
                      f"{r['server_cpu_us_per_token']:.2f} us/token, {r['console_fetches']} console fetches",
                      flush=True)
    tokens = {m: statistics.median(r["tokens_per_s"] for r in rs) for m, rs in runs.items()}
    cpu = {m: statistics.median(r["server_cpu_us_per_token"] for r in rs) for m, rs in runs.items()}
    print(f"console cost, delivered tokens/s with/without: {tokens['with'] / tokens['without']:.3f}")
    print(f"console cost, server CPU per token with/without: {cpu['with'] / cpu['without']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
