"""Durability under kill -9: acknowledged ledger rows and batch lines, and the ledger's throughput.

    .venv/bin/python bench/durability.py [--kills 20] [--clients 8] [--batch-lines 300] [--rounds 4] [--pump-seconds 5]

1. One daemon (a subprocess, sim engine, SQLite store in a temp state directory, auth off) on a fixed
   loopback port. A batch of --batch-lines lines is uploaded and created through the Batch API.
2. --clients clients send completions back to back, half of them streamed, each with its own
   X-Request-Id; a response counts as acknowledged once it has fully arrived (the JSON body, or the
   stream's `data: [DONE]`).
3. --kills times, after a random 0.3-1.5 s, the daemon gets SIGKILL and is started again on the same
   port (the clients' requests in flight fail; they carry on).
4. Then: the batch is left to finish; its output file must hold every custom_id exactly once.
   The daemon is stopped and the database read directly: every acknowledged request id must have
   its ledger row; `PRAGMA integrity_check` must say ok.
5. Throughput, in this process: a daemon (sim engine, --tp-profile timing: a GPU node) serving an
   interactive client that measures TTFT, alone and while --pump-workers tasks record --pump-rate
   synthetic rows a second into its ledger between them, in --rounds alternating phases of
   --pump-seconds with each condition's samples pooled (the machine's slow spells land in both). Prints the
   rows/s the ledger sustained and the p99 TTFT ratio (goal: >= 20,000 rows/s, p99 TTFT x <= 1.1).
Loopback only; every loop is bounded; every daemon is stopped on the way out.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
from daemon_process import run_daemon, spawn, stop  # noqa: E402 (bench/ is this script's own directory)

CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
log_level = "warning"
state_dir = "state"

[models.sim]
backend = "sim"
max_batch_size = 16
num_kv_blocks = 1024
[models.sim.sim]
profile = "{profile}"
time_scale = {time_scale}
max_model_len = 2048
"""
MODES = ("raw", "callers", "ledger")
MODE_HELP = {"raw": "the store's group commits alone, no caller per row",
             "callers": "the simulated requests' tasks, nothing recorded",
             "ledger": "the same tasks, each awaiting Ledger.record to its commit"}
BODY = {"model": "sim", "prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(workdir: Path) -> subprocess.Popen:
    proc, _ = spawn([__file__, "--role", "daemon", "--config", str(workdir / "inferd.toml")], workdir, "daemon.log")
    return proc


# -- the clients ----------------------------------------------------------------------------------------
async def client(http: aiohttp.ClientSession, url: str, stream: bool, acked: set[str], stop_at: asyncio.Event,
                 attempts: list[int]) -> None:
    while not stop_at.is_set():
        rid = "dur-" + uuid.uuid4().hex
        attempts[0] += 1
        try:
            async with http.post(url + "/v1/completions", json={**BODY, "stream": stream},
                                 headers={"X-Request-Id": rid}) as resp:
                data = await resp.read()
            if resp.status == 200 and (data.endswith(b"data: [DONE]\n\n") if stream else b'"usage"' in data):
                acked.add(rid)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            await asyncio.sleep(0.05)           # the daemon is down: it is being restarted


async def create_batch(http: aiohttp.ClientSession, url: str, lines: int) -> str:
    jsonl = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                                "body": {**BODY, "max_tokens": 8}}) + "\n" for i in range(lines))
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", jsonl.encode(), filename="batch.jsonl", content_type="application/jsonl")
    async with http.post(url + "/v1/files", data=form) as resp:
        file_id = (await resp.json())["id"]
    async with http.post(url + "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                                    "completion_window": "24h"}) as resp:
        return (await resp.json())["id"]


async def batch_output(http: aiohttp.ClientSession, url: str, batch_id: str, timeout_s: float) -> list[str]:
    """custom_ids in the finished batch's output and error files (in order)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with http.get(f"{url}/v1/batches/{batch_id}") as resp:
            batch = await resp.json()
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            break
        await asyncio.sleep(0.5)
    else:
        raise RuntimeError(f"batch {batch_id} did not finish in {timeout_s} s: {batch}")
    ids: list[str] = []
    for key in ("output_file_id", "error_file_id"):
        if batch.get(key):
            async with http.get(f"{url}/v1/files/{batch[key]}/content") as resp:
                ids += [json.loads(line)["custom_id"] for line in (await resp.text()).splitlines() if line]
    return ids


async def kills(args: argparse.Namespace, workdir: Path) -> dict:
    port = free_port()
    (workdir / "inferd.toml").write_text(CONFIG.format(port=port, profile="tiny", time_scale=0.05))
    url = f"http://127.0.0.1:{port}"
    acked: set[str] = set()
    attempts = [0]
    proc = start(workdir)
    rng = random.Random(args.seed)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            batch_id = await create_batch(http, url, args.batch_lines)
            stop_at = asyncio.Event()
            clients = [asyncio.ensure_future(client(http, url, i % 2 == 0, acked, stop_at, attempts))
                       for i in range(args.clients)]
            for _ in range(args.kills):
                await asyncio.sleep(rng.uniform(0.3, 1.5))
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                proc = start(workdir)
            await asyncio.sleep(1.0)
            stop_at.set()
            await asyncio.wait_for(asyncio.gather(*clients), 60)
            ids = await batch_output(http, url, batch_id, args.batch_timeout)
    finally:
        stop(proc)
    expected = {f"line-{i}" for i in range(args.batch_lines)}
    lost_or_dup = len(expected - set(ids)) + (len(ids) - len(set(ids))) + len(set(ids) - expected)
    db = sqlite3.connect(f"file:{workdir / 'state' / 'inferd.db'}?mode=ro", uri=True)
    try:
        recorded = {r[0] for r in db.execute("SELECT request_id FROM ledger")}
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()
    return {"kills": args.kills, "requests_sent": attempts[0], "acknowledged": len(acked),
            "ledger_rows": len(recorded), "acknowledged_rows_lost": len(acked - recorded),
            "batch_lines": args.batch_lines, "batch_lines_lost_or_duplicated": lost_or_dup,
            "integrity_check": integrity}


# -- throughput -----------------------------------------------------------------------------------------
async def interactive_ttfts(url: str, seconds: float, clients: int) -> list[float]:
    """TTFTs of `clients` interactive clients streaming back to back for `seconds`."""
    out: list[float] = []
    end = time.monotonic() + seconds

    async def one_client(http: aiohttp.ClientSession) -> None:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            async with http.post(url + "/v1/completions", json={**BODY, "stream": True}) as resp:
                await resp.content.readline()
                out.append(time.perf_counter() - t0)
                await resp.read()

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(one_client(http) for _ in range(clients)))
    return out


async def throughput(args: argparse.Namespace, workdir: Path) -> dict:
    from inferd.config import load_config
    from inferd.daemon import Daemon
    from inferd.store import LedgerRow

    (workdir / "tp").mkdir()
    path = workdir / "tp" / "inferd.toml"
    path.write_text(CONFIG.format(port=0, profile=args.tp_profile, time_scale=1.0))
    daemon = Daemon(load_config(path))
    run = asyncio.ensure_future(daemon.run())
    await asyncio.wait({run, asyncio.ensure_future(daemon.ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
    url = f"http://127.0.0.1:{daemon.port}"
    ledger = daemon.state.ledger
    template = LedgerRow(request_id="", tenant="pump", key_id=None, model="sim", version="v", node="bench",
                         endpoint="completions", stream=False, prompt_tokens=10, cached_tokens=0,
                         completion_tokens=20, status=200, finish_reason="length", queue_s=0.0, prefill_s=0.0,
                         decode_s=0.0, total_s=0.0, cost=0.0, finished_at=time.time())
    pumped = {mode: 0 for mode in MODES}
    last_commit = [0.0]

    async def pump(mode: str, end: float, worker: int, workers: int) -> None:
        """One of `workers` long-lived tasks recording --pump-rate rows/s between them, each row awaited
        to its commit as a request's own task awaits its row (no task per row: requests have theirs)."""
        import msgspec
        period, i = workers / args.pump_rate, 0
        start = time.monotonic() + worker * period / workers
        while start + i * period < end:
            row = msgspec.structs.replace(template, request_id=f"pump-{worker}-{i}-{start}")
            if mode == "ledger":
                await ledger.record(row)
            else:               # "callers": the same tasks and rows, nothing recorded (the scaffolding's cost)
                await asyncio.sleep(0)
            i += 1
            pumped[mode] += 1
            last_commit[0] = time.monotonic()
            await asyncio.sleep(max(0.0, start + i * period - time.monotonic()))

    async def pump_raw(end: float) -> None:
        """The store's side alone: --pump-rate rows/s as the ledger's group commits write them (one
        execute_many per 10 ms tick), without a caller per row on the loop."""
        from inferd.store.ledger import _INSERT, _values
        per_tick, tick, start = max(1, round(args.pump_rate / 100)), 0, time.monotonic()
        while start + tick * 0.01 < end:
            await daemon.state.store.execute_many(_INSERT, [_values(template)] * per_tick)
            pumped["raw"] += per_tick
            last_commit[0] = time.monotonic()
            tick += 1
            await asyncio.sleep(max(0.0, start + tick * 0.01 - time.monotonic()))

    # Short phases in turn (alone, then each pump mode, round after round) with the samples pooled per
    # condition: a slow spell of the machine then lands in every condition instead of deciding a ratio.
    samples: dict[str, list[float]] = {"alone": [], **{mode: [] for mode in args.pump_modes}}
    seconds = {mode: 0.0 for mode in args.pump_modes}
    try:
        for _ in range(args.rounds):
            samples["alone"] += await interactive_ttfts(url, args.pump_seconds, args.interactive)
            for mode in args.pump_modes:
                t0 = time.monotonic()
                end = t0 + args.pump_seconds
                pumping = ([asyncio.ensure_future(pump_raw(end))] if mode == "raw" else
                           [asyncio.ensure_future(pump(mode, end, w, args.pump_workers))
                            for w in range(args.pump_workers)])
                samples[mode] += await interactive_ttfts(url, args.pump_seconds, args.interactive)
                await asyncio.gather(*pumping)
                seconds[mode] += last_commit[0] - t0      # the pump's own span: offered rows to the last commit
    finally:
        daemon.request_stop()
        await run

    alone = p99(samples["alone"])
    return {"ttft_p99_alone_ms": 1000 * alone, "samples": {k: len(v) for k, v in samples.items()},
            "modes": {mode: {"rows_per_s": pumped[mode] / seconds[mode], "ttft_p99_ms": 1000 * p99(samples[mode]),
                             "ttft_p99_ratio": p99(samples[mode]) / alone} for mode in args.pump_modes}}


def p99(v: list[float]) -> float:
    return statistics.quantiles(v, n=100)[98] if len(v) >= 100 else max(v)


async def priority(args: argparse.Namespace, workdir: Path) -> dict:
    """Interactive TTFT alone, then while a --priority-lines batch runs through the daemon's own runner
    (batch priority class) on the same engine: what the batch class leaves interactive traffic."""
    from inferd.config import load_config
    from inferd.daemon import Daemon

    (workdir / "prio").mkdir()
    path = workdir / "prio" / "inferd.toml"
    path.write_text(CONFIG.format(port=0, profile=args.tp_profile, time_scale=1.0).replace(
        "max_batch_size = 16", "max_batch_size = 8"))
    daemon = Daemon(load_config(path))
    run = asyncio.ensure_future(daemon.run())
    await asyncio.wait({run, asyncio.ensure_future(daemon.ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
    url = f"http://127.0.0.1:{daemon.port}"

    try:
        alone = await interactive_ttfts(url, args.pump_seconds, 2)
        async with aiohttp.ClientSession() as http:
            batch_id = await create_batch(http, url, args.priority_lines)
            await asyncio.sleep(1.0)                  # the runner has the engine busy by now
            with_batch = await interactive_ttfts(url, args.pump_seconds, 2)
            async with http.get(f"{url}/v1/batches/{batch_id}") as resp:
                progress = (await resp.json())["request_counts"]
    finally:
        daemon.request_stop()
        daemon.request_stop()
        await run

    def pct(v: list[float], q: int) -> float:
        return statistics.quantiles(v, n=100)[q - 1]

    return {"ttft_p50_alone_ms": 1000 * pct(alone, 50), "ttft_p50_batch_ms": 1000 * pct(with_batch, 50),
            "ttft_p99_alone_ms": 1000 * pct(alone, 99), "ttft_p99_batch_ms": 1000 * pct(with_batch, 99),
            "batch_lines_done_meanwhile": progress["completed"], "samples": [len(alone), len(with_batch)]}


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="inferd-durability-") as tmp:
        workdir = Path(tmp)
        if args.only in (None, "kills"):
            k = await kills(args, workdir)
            print(json.dumps(k), file=sys.stderr)
            print(f"acknowledged rows lost: {k['acknowledged_rows_lost']} (of {k['acknowledged']} acknowledged, "
                  f"{k['kills']} kills)")
            print(f"batch lines lost or duplicated: {k['batch_lines_lost_or_duplicated']} (of {k['batch_lines']})")
            print(f"integrity_check: {k['integrity_check']}")
        if args.only == "kills":
            return
        if args.only == "priority":
            p = await priority(args, workdir)
            print(json.dumps(p), file=sys.stderr)
            print(f"interactive TTFT beside a running batch: p50 {p['ttft_p50_alone_ms']:.1f} -> "
                  f"{p['ttft_p50_batch_ms']:.1f} ms, p99 {p['ttft_p99_alone_ms']:.1f} -> "
                  f"{p['ttft_p99_batch_ms']:.1f} ms ({p['batch_lines_done_meanwhile']} batch lines done meanwhile)")
            return
        t = await throughput(args, workdir)
        print(json.dumps(t), file=sys.stderr)
        print(f"interactive p99 TTFT alone: {t['ttft_p99_alone_ms']:.1f} ms ({args.rounds} rounds of "
              f"{args.pump_seconds:g} s phases, pooled)")
        for mode, m in t["modes"].items():
            print(f"  {mode:8s} {m['rows_per_s']:9,.0f} rows/s   p99 TTFT {m['ttft_p99_ms']:.1f} ms  "
                  f"x{m['ttft_p99_ratio']:.2f}   ({MODE_HELP[mode]})")
        if {"callers", "ledger"} <= t["modes"].keys():
            m = t["modes"]
            print(f"ledger's own cost on p99 TTFT (ledger / callers): "
                  f"x{m['ledger']['ttft_p99_ms'] / m['callers']['ttft_p99_ms']:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch-lines", type=int, default=300)
    parser.add_argument("--batch-timeout", type=float, default=180.0)
    parser.add_argument("--pump-seconds", type=float, default=1.5, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=16, help="rounds of phases (alone, then each pump mode)")
    parser.add_argument("--pump-rate", type=float, default=21_000, help="ledger rows/s the pump offers")
    parser.add_argument("--interactive", type=int, default=8, help="interactive clients measuring TTFT")
    parser.add_argument("--pump-workers", type=int, default=1000, help="concurrent recorders (requests ending)")
    parser.add_argument("--pump-modes", nargs="+", choices=MODES, default=list(MODES),
                        help="; ".join(f"{k}: {v}" for k, v in MODE_HELP.items()))
    parser.add_argument("--tp-profile", default="llama3-8b-h100", help="the throughput phase's sim profile "
                        "(tiny at time_scale 1 has ~2 ms TTFT: then the figure is the front end's own overhead)")
    parser.add_argument("--only", choices=("kills", "throughput", "priority"), help="run one phase (priority: "
                        "only with --only; interactive TTFT beside a running batch)")
    parser.add_argument("--priority-lines", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--role", default="bench", choices=("bench", "daemon"))
    parser.add_argument("--config", type=Path)
    args = parser.parse_args()
    if args.role == "daemon":
        run_daemon(args.config)
    else:
        asyncio.run(main(args))
