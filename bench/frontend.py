"""Front-end benchmark: delivered tokens/s and SSE frames/s through the full daemon vs a bare SSE server.

    .venv/bin/python bench/frontend.py [--seconds 10] [--concurrency 256] [--max-tokens 256]
    .venv/bin/python bench/frontend.py --scaling 256 1024 2048 [--rounds 2] [--seconds 6] [--front-processes 1]

Phases (each bounded; the script stops itself):
  1. The daemon (inferd.daemon.lifecycle.Daemon in a subprocess: uvloop, config file, engines, app, AppRunner)
     serving a sim model with `time_scale = 0`, so the engine costs only its Python step; pinned to
     CPU 0. Frames are whatever the daemon writes: one per stream per flush, carrying every token
     the engine produced since the last one (no frame budget, no spacing).
  2. A load generator in another process, pinned to CPU 1 (client CPU never runs in the server's
     process): `--concurrency` streaming completions kept open, each new one started when one ends.
     It counts SSE frames as they arrive and tokens from each stream's usage chunk (prorated over the
     measuring window), after a warm-up.
  3. One request at a time: the time to the first token as the client sees it.
  4. The same load and TTFT phases against a bare aiohttp handler that only writes pre-built frames
     (same frame sizes; one frame per loop turn, as a handler fed by an engine): the ceiling for SSE
     frames/s on this machine. The ratio compares the daemon's frames/s in phase 2 (the run that
     delivers its tokens/s) with it.
It prints JSON results and a summary: daemon tokens/s and frames/s, bare frames/s, their ratio, the
server's and the client's CPU use during each load phase (a client near 100% means it, not the
server, set the pace), the load average, and TTFT p50/p99 for both (the difference is the time the
daemon adds before the first token: engine time at time_scale 0 is a step of Python).
The server's CPU is its process's and every process's under it (bench/process_cpu.py), read over the
client's measuring window. `daemon/bare CPU per frame` and `daemon/bare CPU per token` divide the
daemon's CPU per frame (per token) by the bare handler's in the same run: ratios a slow machine or a
busy day leaves about where they are, where a rate or a time per frame does not. Each daemon load phase also
prints CPU per 1k tokens per process role (bench/process_cpu.py: `engine` the daemon, `writer` its SSE writer
processes with --front-processes N; the daemon's tree stays on the server CPU, writers inherit its affinity).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from daemon_process import pin, place_writers, run_daemon, spawn, stop  # noqa: E402 (bench/ is this script's own directory)
from process_cpu import per_1k_tokens, role_lines, projection, sample_tree, window_cpu  # noqa: E402
from sse_load import run_client  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPU, CLIENT_CPU = 0, 1

CONFIG = """
[server]
host = "127.0.0.1"
front_processes = {front_processes}
port = 0
log_level = "info"
heartbeat_interval_s = 15.0
max_connections = {max_connections}

[models.sim]
backend = "sim"
max_batch_size = {concurrency}
max_num_tokens = 8192
num_kv_blocks = {kv_blocks}   # every stream's whole context: the front is measured, not KV preemption

[models.sim.sim]
profile = "llama3-8b-h100"
time_scale = 0.0   # no simulated step time: the engine costs only its Python
max_model_len = 8192

# auth is off on loopback: every request is tenant `local`; let it hold every stream the bench opens, and queue
# them all: streams of one length end together and start again together, in waves of every stream at once
[tenants.local]
max_concurrent_requests = {concurrency}
max_queued_requests = {concurrency}

# One tenant: the fair queue has nobody to arbitrate between, and with steps of microseconds the
# default (release 2 while the engine's queue is below 2, per dispatcher wake) caps how fast
# requests can start; let the engine take every waiting request at its next step.
[admission]
max_engine_waiting = {concurrency}
max_queued_requests = {concurrency}
"""


# -- the bare SSE server ---------------------------------------------------------------------------
def run_bare(max_tokens_cap: int) -> None:
    import uvloop
    from aiohttp import web

    chunk = (b'data: {"id":"cmpl-0123456789abcdef01234567","object":"text_completion","created":1700000000,'
             b'"model":"sim@sim-000000000000+simulated","system_fingerprint":"inferd-0.1.0-sim","choices":'
             b'[{"index":0,"text":" word","logprobs":null,"finish_reason":null}],"usage":null}\n\n')
    usage = (b'data: {"id":"cmpl-0123456789abcdef01234567","object":"text_completion","created":1700000000,'
             b'"model":"sim","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":0}}\n\n')

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = min(int(body.get("max_tokens", 16)), max_tokens_cap)
        resp = web.StreamResponse(headers={"Cache-Control": "no-cache"})
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        for _ in range(n):
            await resp.write(chunk)
            await asyncio.sleep(0)    # one frame per loop turn, as a handler fed by an engine
        await resp.write(usage % n)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(json.dumps({"port": runner.addresses[0][1]}), flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# -- orchestration ---------------------------------------------------------------------------------
def client(port: int, phase: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--role", "client", "--phase", phase, "--port", str(port),
           "--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens),
           "--warmup", str(args.warmup), "--seconds", str(args.seconds if phase == "load" else args.ttft_seconds)]
    out = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=lambda: pin(CLIENT_CPU),
                         timeout=args.seconds + args.warmup + 60)
    if out.returncode != 0:
        raise RuntimeError(f"client failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def load_phase(proc: subprocess.Popen, port: int, args: argparse.Namespace) -> dict:
    """The load client's results, with the server's CPU (its process and every one under it) over the
    client's measuring window: read --warmup seconds after the client says it started, and --seconds later."""
    cmd = [sys.executable, __file__, "--role", "client", "--phase", "load", "--port", str(port),
           "--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens),
           "--warmup", str(args.warmup), "--seconds", str(args.seconds)]
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: pin(CLIENT_CPU))
    try:
        started = client.stdout.readline()
        if started:
            time.sleep(args.warmup)
            tree0, t0 = sample_tree(proc.pid), time.monotonic()
            time.sleep(args.seconds)
            per_role, window = window_cpu(tree0, sample_tree(proc.pid)), time.monotonic() - t0
        out, err = client.communicate(timeout=args.seconds + args.warmup + 60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    if client.returncode != 0 or not started:
        raise RuntimeError(f"client failed: {err[-2000:] if started else 'no start line'}")
    result = json.loads(out.strip().splitlines()[-1])
    cpu = sum(sum(seconds) for seconds in per_role.values())
    result["roles"] = per_1k_tokens(per_role, result["tokens_per_s"] * window)
    result["server_cpu_util"] = cpu / window
    result["server_cpu_us_per_frame"] = cpu / max(1.0, result["frames_per_s"] * window) * 1e6
    result["tokens_per_frame"] = result["tokens_per_s"] / max(1.0, result["frames_per_s"])
    result["server_cpu_us_per_token"] = result["server_cpu_us_per_frame"] / max(1e-9, result["tokens_per_frame"])
    return result


def measure(proc: subprocess.Popen, port: int, args: argparse.Namespace, with_ttft: bool) -> dict:
    result = load_phase(proc, port, args)
    if with_ttft:
        result["ttft"] = client(port, "ttft", args)
    return result


def start_server(role: str, workdir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, int]:
    """Start the daemon or the bare server pinned to the server CPU; it prints {"port": N} when ready."""
    config = workdir / "inferd.toml"
    config.write_text(CONFIG.format(concurrency=args.concurrency, max_connections=args.concurrency + 64,
                                    front_processes=args.front_processes,
                                    kv_blocks=args.concurrency * (args.max_tokens + 64) // 16 + 64))
    proc, started = spawn([__file__, "--role", role, "--config", str(config), "--max-tokens", str(args.max_tokens)],
                          workdir, f"{role}.log", SERVER_CPU)
    place_writers(proc.pid, SERVER_CPU)
    return proc, started["port"]


def _summary(name: str, r: dict) -> str:
    return (f"{name}: {r['tokens_per_s']:,.0f} delivered tokens/s, {r['frames_per_s']:,.0f} frames/s "
            f"({r['tokens_per_frame']:.2f} tokens/frame); server CPU {r['server_cpu_util']:.0%} "
            f"({r['server_cpu_us_per_frame']:.1f} us/frame), client CPU {r['client_cpu_util']:.0%}, "
            f"errors {r['errors']}" + (f" (the first: {r['first_error']})" if r.get("first_error") else "")
            + f"; the window's last requests ended {r['drain_s']:.1f} s after it")


def scaling(args: argparse.Namespace) -> int:
    """The daemon's load phase at each of --scaling's concurrencies, --rounds times in turn."""
    load_before = os.getloadavg()
    runs: dict[int, list[dict]] = {c: [] for c in args.scaling}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for concurrency in args.scaling:
                args.concurrency = concurrency
                proc, port = start_server("daemon", Path(tmp), args)
                try:
                    r = measure(proc, port, args, with_ttft=False)
                finally:
                    stop(proc, 15)
                runs[concurrency].append(r)
                print(_summary(f"daemon ({concurrency} streams)", r), flush=True)
                print("\n".join(role_lines(r["roles"], projection(r["roles"]))), flush=True)
    base = statistics.median(r["tokens_per_s"] for r in runs[args.scaling[0]])
    for concurrency, rs in runs.items():
        median = statistics.median(r["tokens_per_s"] for r in rs)
        print(f"{concurrency} streams: median {median:,.0f} delivered tokens/s = {median / base:.2f} of "
              f"{args.scaling[0]} streams' ({args.rounds} rounds in turn)")
    print("load average (1, 5, 15 min) before {:.2f} {:.2f} {:.2f}, after {:.2f} {:.2f} {:.2f}".format(
        *load_before, *os.getloadavg()))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["main", "daemon", "bare", "client"], default="main")
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--phase", choices=["load", "ttft"], default="load")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--seconds", type=float, default=10.0, help="measuring window per load phase")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--ttft-seconds", type=float, default=3.0)
    p.add_argument("--scaling", type=int, nargs="+", metavar="STREAMS",
                   help="instead of the phases above: the daemon's load phase at each of these concurrencies, "
                   "--rounds times in turn (a slow spell of the machine lands in every one), and each one's "
                   "median tokens/s over the first's, e.g. --scaling 256 1024 2048")
    p.add_argument("--rounds", type=int, default=2, help="with --scaling")
    p.add_argument("--front-processes", type=int, default=0,
                   help="the daemon's [server] front_processes: SSE writer processes (0: every stream written "
                   "in the daemon; its connection is kept alive). With N > 0 each stream's connection closes "
                   "after it and the client opens a new one (bench/sse_load.py reuse)")
    args = p.parse_args()
    if args.role == "daemon":
        run_daemon(args.config)
        return 0
    if args.role == "bare":
        run_bare(args.max_tokens)
        return 0
    if args.role == "client":
        run_client(args)
        return 0

    if args.scaling:
        return scaling(args)
    results = {"load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        for role in ("daemon", "bare"):
            proc, port = start_server(role, Path(tmp), args)
            try:
                results[role] = measure(proc, port, args, with_ttft=True)
            finally:
                stop(proc, 15)
    results["load_average_after"] = os.getloadavg()
    d, b = results["daemon"], results["bare"]
    results["frames_ratio"] = d["frames_per_s"] / b["frames_per_s"] if b["frames_per_s"] else 0.0
    results["ttft_added_p50_ms"] = d["ttft"]["p50_ms"] - b["ttft"]["p50_ms"]
    results["ttft_added_p99_ms"] = d["ttft"]["p99_ms"] - b["ttft"]["p99_ms"]
    # CPU cost against the bare handler's, both read over their own window of this run: a slow day slows both
    results["cpu_per_frame_ratio"] = d["server_cpu_us_per_frame"] / max(1e-9, b["server_cpu_us_per_frame"])
    results["cpu_per_token_ratio"] = d["server_cpu_us_per_token"] / max(1e-9, b["server_cpu_us_per_token"])
    print(json.dumps(results, indent=2))
    for name, r in (("daemon", d), ("bare  ", b)):
        print(_summary(name, r))
    print("daemon " + "\ndaemon ".join(role_lines(d["roles"], projection(d["roles"]))))
    print(f"ratio:  daemon frames/s = {results['frames_ratio']:.0%} of the bare frames/s (same run, same load)")
    print(f"daemon/bare CPU per frame: {results['cpu_per_frame_ratio']:.2f}x ({d['server_cpu_us_per_frame']:.1f} us "
          f"against {b['server_cpu_us_per_frame']:.1f} us, same run)")
    print(f"daemon/bare CPU per token: {results['cpu_per_token_ratio']:.2f}x ({d['server_cpu_us_per_token']:.1f} us "
          f"at {d['tokens_per_frame']:.2f} tokens/frame against {b['server_cpu_us_per_token']:.1f} us at "
          f"{b['tokens_per_frame']:.2f})")
    print(f"TTFT at 1 concurrent request: daemon p50 {d['ttft']['p50_ms']:.2f} ms p99 {d['ttft']['p99_ms']:.2f} ms; "
          f"bare p50 {b['ttft']['p50_ms']:.2f} ms p99 {b['ttft']['p99_ms']:.2f} ms; "
          f"added p50 {results['ttft_added_p50_ms']:.2f} ms p99 {results['ttft_added_p99_ms']:.2f} ms")
    print("load average (1, 5, 15 min) before {:.2f} {:.2f} {:.2f}, after {:.2f} {:.2f} {:.2f}".format(
        *results["load_average_before"], *results["load_average_after"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
