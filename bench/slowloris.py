"""Slow-client benchmark: do connections that drip, stall or idle get cut, and do probes still answer?

    .venv/bin/python bench/slowloris.py [--connections 300] [--header-timeout 2] [--body-timeout 2]
                                        [--idle-timeout 2] [--max-connections 256]

The daemon (a sim model, the real listener) runs in a subprocess with the given [server] limits.
This script opens --connections connections split four ways, as the red team did:
  drip     sends a request's headers one byte every 0.5 s and never finishes them
  stall    sends headers that promise a 1 MB body, then nothing
  silent   connects and sends nothing
  partial  sends half a request line and stops
It then measures `/readyz` from a fresh connection every 0.1 s for the length of the attack, waits
until every attacking connection is closed by the server (bounded: 3 x the largest timeout + 5 s),
and prints how many were cut, after how long (p50/max per kind), the probe's success rate and p99
latency during the attack, and the daemon's inferd_http_connections_cut_total by reason. Loopback
only; every loop is bounded and the daemon is stopped at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from daemon_process import run_daemon, spawn, stop  # noqa: E402 (bench/ is this script's own directory)

CONFIG = """
[server]
host = "127.0.0.1"
port = 0
log_level = "warning"
header_timeout_s = {header}
body_timeout_s = {body}
idle_timeout_s = {idle}
max_connections = {max_connections}

[models.sim]
backend = "sim"

[models.sim.sim]
profile = "tiny"
time_scale = 0.0
max_model_len = 512
"""
KINDS = ("drip", "stall", "silent", "partial")


async def attacker(kind: str, port: int, opened: float, cut: dict[str, list[float]], give_up: float) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        cut[kind].append(0.0)                     # refused at once (over the cap): cut at accept
        return
    start = time.monotonic()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    try:
        if kind == "stall":
            writer.write(head + b"Content-Length: 1000000\r\n\r\n{")
        elif kind == "partial":
            writer.write(b"POST /v1/compl")
        if kind == "drip":
            for byte in head:
                writer.write(bytes([byte]))
                if await _closed(reader, 0.5):
                    break
        else:
            await asyncio.wait_for(reader.read(), max(0.0, give_up - time.monotonic()))
        cut[kind].append(time.monotonic() - start)
    except (asyncio.TimeoutError, ConnectionError):
        if isinstance(sys.exc_info()[1], ConnectionError):
            cut[kind].append(time.monotonic() - start)
    finally:
        writer.close()


async def _closed(reader: asyncio.StreamReader, wait_s: float) -> bool:
    """True when the server closed the connection within `wait_s`."""
    try:
        return await asyncio.wait_for(reader.read(1), wait_s) == b""
    except asyncio.TimeoutError:
        return False


def probe(port: int) -> float | None:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return time.monotonic() - t0 if resp.status == 200 else None
    except OSError:
        return None


async def run(args: argparse.Namespace, port: int) -> dict:
    cut: dict[str, list[float]] = {k: [] for k in KINDS}
    opened = time.monotonic()
    give_up = opened + 3 * max(args.header_timeout, args.body_timeout, args.idle_timeout) + 5
    attacks = [asyncio.ensure_future(attacker(KINDS[i % 4], port, opened, cut, give_up))
               for i in range(args.connections)]
    probes: list[float | None] = []
    loop = asyncio.get_running_loop()
    while not all(a.done() for a in attacks) and time.monotonic() < give_up:
        probes.append(await loop.run_in_executor(None, probe, port))
        await asyncio.sleep(0.1)
    for a in attacks:
        a.cancel()
    await asyncio.gather(*attacks, return_exceptions=True)
    ok = sorted(p for p in probes if p is not None)
    return {"cut": {k: len(v) for k, v in cut.items()}, "per_kind": args.connections // 4,
            "cut_after_s": {k: (round(sorted(v)[len(v) // 2], 2), round(max(v), 2)) if v else None
                            for k, v in cut.items()},
            "probes": len(probes), "probes_ok": len(ok),
            "probe_p99_ms": round(ok[min(len(ok) - 1, int(len(ok) * 0.99))] * 1000, 1) if ok else None}


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'inferd_http_connections_cut_total\{reason="([a-z_]+)"\} (\S+)', text)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["main", "daemon"], default="main")
    p.add_argument("--config", type=Path)
    p.add_argument("--connections", type=int, default=300)
    p.add_argument("--header-timeout", type=float, default=2.0)
    p.add_argument("--body-timeout", type=float, default=2.0)
    p.add_argument("--idle-timeout", type=float, default=2.0)
    p.add_argument("--max-connections", type=int, default=256)
    args = p.parse_args()
    if args.role == "daemon":
        run_daemon(args.config)
        return 0
    with tempfile.TemporaryDirectory(prefix="inferd-slowloris-") as tmp:
        config = Path(tmp) / "inferd.toml"
        config.write_text(CONFIG.format(header=args.header_timeout, body=args.body_timeout, idle=args.idle_timeout,
                                        max_connections=args.max_connections))
        proc, started = spawn([__file__, "--role", "daemon", "--config", str(config)], Path(tmp), "daemon.log")
        try:
            port = started["port"]
            result = asyncio.run(run(args, port))
            result["inferd_http_connections_cut_total"] = metrics(port)
        finally:
            stop(proc)
    print(json.dumps(result, indent=2))
    print(f"\n{args.connections} slow connections ({result['per_kind']} of each kind), timeouts header "
          f"{args.header_timeout} s / body {args.body_timeout} s / idle {args.idle_timeout} s, "
          f"max_connections {args.max_connections}:")
    for kind in KINDS:
        print(f"  {kind:8} cut {result['cut'][kind]:4}/{result['per_kind']}   after p50/max "
              f"{result['cut_after_s'][kind]} s")
    print(f"  /readyz from a fresh connection during the attack: {result['probes_ok']}/{result['probes']} ok, "
          f"p99 {result['probe_p99_ms']} ms")
    print(f"  daemon's inferd_http_connections_cut_total: {result['inferd_http_connections_cut_total']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
