"""First start from nothing: `inferd serve --config config.toml` (the shipped file) with a fresh engines
directory and a fresh state directory, as command 1 of the README runs it on a fresh clone.

Measures, from the moment the process is spawned:
    first_answer_s   the first HTTP answer of any kind from GET /readyz (503 `starting` while models load)
    ready_s          the first 200 from GET /readyz
and, from the daemon's own log lines (their timestamps against the spawn time):
    accepting_s      the listener answering (event `accepting`)
    built_s          the last synthetic artifact built (event `engine_built`)
    loaded_s         the last version ready (event `version_ready`)

Usage: python bench/first_start.py [--runs 3] [--timeout 120] [--busy 1]
(--busy N: N other processes spin at 100% of a core meanwhile, as on a laptop doing something else.)
Prints `name: value` lines, per run and the median over runs. The goal on an idle 2-core machine:
first_answer_s under 3, ready_s under 30.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readyz(port: int) -> int | None:
    """The status GET /readyz answers (None: no answer: refused, reset or timed out)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def config_for(workdir: Path, port: int) -> Path:
    """The shipped config.toml on another port; engines and state under `workdir` (both empty)."""
    lines = []
    for line in (ROOT / "config.toml").read_text().splitlines():
        if line.startswith("port = "):
            line = f"port = {port}"
        lines.append(line)
    path = workdir / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def log_marks(log_path: Path, t0_wall: float) -> dict[str, float]:
    marks: dict[str, float] = {}
    names = {"accepting": "accepting_s", "engine_built": "built_s", "version_ready": "loaded_s"}
    for raw in log_path.read_text().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        name = names.get(line.get("event"))
        if name is not None:
            marks[name] = max(marks.get(name, 0.0), round(line["ts"] - t0_wall, 3))
    return marks


def spinners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def one_run(timeout: float, busy: int = 0) -> dict[str, float]:
    hogs = spinners(busy)
    try:
        return _measure(timeout)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _measure(timeout: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="inferd-first-start-") as tmp:
        workdir, port = Path(tmp), free_port()
        config = config_for(workdir, port)
        log_path = workdir / "daemon.log"
        env_path = str(ROOT)
        with open(log_path, "w") as log:
            t0_wall, t0 = time.time(), time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "inferd", "serve", "--config", str(config)],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                                    env={**os.environ, "PYTHONPATH": env_path})
        result: dict[str, float] = {}
        try:
            while time.monotonic() - t0 < timeout and proc.poll() is None:
                status = readyz(port)
                now = round(time.monotonic() - t0, 3)
                if status is not None and "first_answer_s" not in result:
                    result["first_answer_s"] = now
                if status == 200:
                    result["ready_s"] = now
                    break
                time.sleep(POLL_S)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if "ready_s" not in result:
            tail = "\n".join(log_path.read_text().splitlines()[-15:])
            raise SystemExit(f"not ready within {timeout:.0f} s; the daemon's log ends:\n{tail}")
        result.update(log_marks(log_path, t0_wall))
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning at 100%% of a core meanwhile")
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        run = one_run(args.timeout, args.busy)
        runs.append(run)
        print(f"run {i + 1}: " + "  ".join(f"{k}={v}" for k, v in run.items()), flush=True)
    print(f"busy_processes: {args.busy}")
    for key in ("first_answer_s", "accepting_s", "built_s", "loaded_s", "ready_s"):
        values = [r[key] for r in runs if key in r]
        if values:
            print(f"{key}: {statistics.median(values):.2f}")


if __name__ == "__main__":
    main()
