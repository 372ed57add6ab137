"""One SSE writer process's CPU per frame, alone: the writer-process goal (10 ms per 1k tokens) at one token a frame.

    .venv/bin/python bench/writer_frames.py [--streams 256] [--step-ms 10] [--seconds 8] [--usage]

This process plays the daemon's main process (inferd.api.streaming.writers) without the daemon: it starts one
writer process (`python -m inferd.api.streaming.writer_proc`, pinned to the last CPU), hands it --streams
loopback TCP connections (OPEN, SCM_RIGHTS), and every --step-ms sends one STEP with one token's text for every
stream, as an engine step does at 1 token a frame (node.py at 2 x 256 streams). This process, pinned to CPU 0,
reads every client socket to its end, and reads and drops the writer's reports. After a second's warm-up, it reads
the writer's CPU time (/proc/<pid>/stat) over --seconds. `--usage` has every frame carry the usage so far
(continuous usage stats, as node.py's clients ask).

It prints `writer CPU per frame: X us` and `writer CPU per 1k tokens: Y ms` (one token a frame: Y = X), with
the frames sent and the share of the writer's CPU that was busy. Without the daemon's engines, admission and
ledger beside it, the figure varies less from run to run than node.py's writer line; it is the same code.
Loopback only; every phase is bounded.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inferd.api.streaming import writer_wire as wire  # noqa: E402
from inferd.api.streaming.writers import child_env  # noqa: E402

from daemon_process import cpu_seconds  # noqa: E402 (bench/ is this script's own directory)

STOP_WITHIN_S = 10.0


def writer_cpu() -> set[int]:
    """The writer's CPU: the machine's last (this process keeps CPU 0), or every CPU on a 1-CPU machine."""
    count = os.cpu_count() or 1
    return {count - 1}


async def open_streams(channel: socket.socket, streams: int, usage: bool) -> list[socket.socket]:
    """Hand the writer `streams` loopback connections; returns the clients' ends, read to their end here."""
    loop = asyncio.get_running_loop()
    clients = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        for sid in range(1, streams + 1):
            client = socket.create_connection(listener.getsockname())
            server, _ = listener.accept()
            socket.send_fds(channel, [wire.encode([wire.OPEN, sid, True, "chat.completion", f"chatcmpl-{sid}", 1,
                                                   "sim", "fp", usage, 50 if usage else None, 0])], [server.fileno()])
            server.close()                  # the writer has its own copy
            client.setblocking(False)
            loop.add_reader(client.fileno(), drain, client)
            clients.append(client)
    return clients


def drain(sock: socket.socket) -> None:
    try:
        sock.recv(1 << 16)
    except (BlockingIOError, ConnectionError):
        pass


async def steps(channel: socket.socket, streams: int, step_s: float, seconds: float) -> int:
    """A STEP with a token for every stream each `step_s`, for `seconds`; returns how many were sent."""
    loop = asyncio.get_running_loop()
    end = next_at = loop.time()
    end += seconds
    sent = 0
    while loop.time() < end:
        pushed = time.monotonic()
        channel.send(wire.encode([wire.STEP, [[sid, " tok", 1, pushed] for sid in range(1, streams + 1)]]))
        sent += 1
        next_at += step_s
        await asyncio.sleep(max(0.0, next_at - loop.time()))
    return sent


async def measure(args: argparse.Namespace) -> dict:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (ours, theirs):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, wire.SOCKET_BUFFER)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferd.api.streaming.writer_proc", str(theirs.fileno()), pass_fds=(theirs.fileno(),),
        env=child_env(), preexec_fn=lambda: os.sched_setaffinity(0, writer_cpu()))
    theirs.close()
    ours.setblocking(False)
    loop = asyncio.get_running_loop()
    loop.add_reader(ours.fileno(), lambda: drain(ours))         # its reports (READY, TOOK, DELAYS): dropped
    clients: list[socket.socket] = []
    try:
        clients = await open_streams(ours, args.streams, args.usage)
        await steps(ours, args.streams, args.step_ms / 1000, 1.0)
        cpu0, t0 = cpu_seconds(process.pid), time.monotonic()
        sent = await steps(ours, args.streams, args.step_ms / 1000, args.seconds)
        cpu1, t1 = cpu_seconds(process.pid), time.monotonic()
    finally:
        loop.remove_reader(ours.fileno())
        ours.close()                        # end-of-file: the writer writes out what waits, then exits
        await asyncio.wait_for(process.wait(), STOP_WITHIN_S)
        for client in clients:
            loop.remove_reader(client.fileno())
            client.close()
    frames = sent * args.streams
    return {"frames": frames, "writer_cpu_s": cpu1 - cpu0, "window_s": t1 - t0,
            "us_per_frame": (cpu1 - cpu0) / max(1, frames) * 1e6}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--step-ms", type=float, default=10.0, help="a STEP (one token for every stream) this often")
    p.add_argument("--seconds", type=float, default=8.0, help="measuring window")
    p.add_argument("--usage", action="store_true", help="every frame carries the usage so far")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    result = asyncio.run(measure(args))
    print(f"writer frames: {result['frames']:,} ({args.streams} streams, a STEP every {args.step_ms:g} ms, "
          f"{result['window_s']:.1f} s; usage in every frame: {'yes' if args.usage else 'no'})")
    print(f"writer CPU per frame: {result['us_per_frame']:.2f} us "
          f"(the writer busy {result['writer_cpu_s'] / result['window_s']:.0%} of the window)")
    print(f"writer CPU per 1k tokens: {result['us_per_frame']:.2f} ms (one token a frame)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
