"""Server subprocesses for the benchmarks: the real Daemon (config file, engines, app, listener, drain
on SIGTERM) as `inferd serve` runs it, printing one JSON line with its port and the inferd it imported
once it is ready; starting such a process, pinning it to a CPU, reading its CPU time, stopping it."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any


def pin(cpu: int) -> None:
    """Run this process on `cpu` only (when the machine has it), so server and clients do not share one."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > cpu:
        os.sched_setaffinity(0, {cpu})


def place_writers(root: int, server_cpu: int, client_cpus: set[int] = frozenset()) -> int:
    """Move the daemon's SSE writer processes (they inherit its pin) off `server_cpu` onto the machine's other
    CPUs, as a node's spare cores would run them: a writer sharing the daemon's one core would only take
    turns with it. The load generators' `client_cpus` are avoided where CPUs are left beside them. Returns
    how many were moved (none on a 1-CPU machine)."""
    from process_cpu import descendants, role_of

    others = set(range(os.cpu_count() or 1)) - {server_cpu}
    others = (others - set(client_cpus)) or others
    if not others or not hasattr(os, "sched_setaffinity"):
        return 0
    moved = 0
    for pid in descendants(root)[1:]:
        try:
            if role_of(pid, is_root=False) == "writer":
                os.sched_setaffinity(pid, others)
                moved += 1
        except (OSError, ValueError):       # it exited meanwhile
            continue
    return moved


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn(argv: list[str], workdir: Path, log_name: str, cpu: int | None = None) -> tuple[subprocess.Popen, dict]:
    """Start `python argv...` in `workdir` (stderr to workdir/log_name, pinned to `cpu` if given) and
    wait for the JSON line it prints once ready; a server that fails to start exits, closing stdout."""
    with (workdir / log_name).open("w") as log:         # the child writes to its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, *argv], cwd=workdir, stdout=subprocess.PIPE, stderr=log, text=True,
                                preexec_fn=None if cpu is None else (lambda: pin(cpu)))
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        raise RuntimeError(f"{argv[0]} did not start: {(workdir / log_name).read_text()[-2000:]}")
    return proc, json.loads(line)


def run_daemon(config_path: Path) -> None:
    import uvloop

    import inferd
    from inferd.config import load_config
    from inferd.daemon import Daemon
    from inferd.observability import configure_logging

    config = load_config(config_path)
    configure_logging(config.server.log_level)
    if os.environ.get("INFERD_BENCH_SWITCH_INTERVAL_S"):      # an experiment's knob: the GIL's switch interval
        sys.setswitchinterval(float(os.environ["INFERD_BENCH_SWITCH_INTERVAL_S"]))

    async def main() -> int:
        daemon = Daemon(config, config_path=config_path, tune_collector=True)   # as `inferd serve`; a SIGHUP re-reads it
        run = asyncio.ensure_future(daemon.run(install_signals=True))
        ready = asyncio.ensure_future(daemon.ready.wait())
        await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
        if daemon.ready.is_set():
            started = {"port": daemon.port, "inferd": inferd.__file__}
            if daemon.state.cluster is not None:      # bench/cluster.py: peers join through this address
                host, port = daemon.state.cluster.gossip.address
                started.update(gossip=f"{host}:{port}", node_id=daemon.state.cluster.node_id)
            print(json.dumps(started), flush=True)
        return await run

    sys.exit(uvloop.run(main()))


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM (the daemon drains), then SIGKILL if it has not exited within `timeout` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def daemon_or_bench(args, prefix: str, start: Callable[[Path], tuple[subprocess.Popen, dict]],
                    bench: Callable[[dict, int], Coroutine[Any, Any, dict]], client_cpu: int = 1) -> dict | None:
    """The main of a script that is both the bench and (`--role daemon`, re-run by `start`) its daemon.

    As the daemon: serve `args.config` (returns None when it exits). As the bench: pin this process to
    `client_cpu`, `start(workdir)` the daemon in a temporary directory, run `bench(started, pid)` and
    stop the daemon whatever happens; returns its results with the inferd the daemon imported."""
    if args.role == "daemon":
        run_daemon(args.config)
        return None
    pin(client_cpu)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        proc, started = start(Path(tmp))
        try:
            results = asyncio.run(bench(started, proc.pid))
        finally:
            stop(proc)
    results["inferd"] = str(Path(started["inferd"]).parent)
    return results


def create_key(config: Path, tenant: str, *scopes: str, cwd: Path | None = None) -> str:
    """A new API key for `tenant` (scopes: inference by default), made as an operator would, with
    `inferd keys create` against `config`'s keys file."""
    argv = [sys.executable, "-m", "inferd", "keys", "create", "--tenant", tenant, "--config", str(config)]
    for scope in scopes:
        argv += ["--scope", scope]
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)
    found = re.search(r"\binf_\S+", out.stdout)
    if found is None:
        raise RuntimeError(f"keys create failed: {out.stdout}{out.stderr}")
    return found.group()


def http_status(url: str) -> int | None:
    """The status GET `url` answers (None: nothing listening)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def serve_config(config_path: Path, workdir: Path, timeout: float, tag: str) -> tuple[subprocess.Popen, int, Path]:
    """`inferd serve --config` on a config whose port is 0: the process, the port it logged, its log file,
    once GET /readyz answers 200. Exits with the log's tail if it is not ready within `timeout` seconds."""
    log_path = workdir / "daemon.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "inferd", "serve", "--config", str(config_path)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    deadline = time.monotonic() + timeout
    port = None
    while time.monotonic() < deadline and proc.poll() is None:
        for line in log_path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "listening":
                port = int(event["port"])
        if port and http_status(f"http://127.0.0.1:{port}/readyz") == 200:
            return proc, port, log_path
        time.sleep(0.2)
    stop(proc, 40.0)
    raise SystemExit(f"[{tag}] daemon not ready within {timeout:.0f} s; see {log_path}:\n"
                     + "\n".join(log_path.read_text().splitlines()[-20:]))
