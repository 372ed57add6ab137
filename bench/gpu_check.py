#!/usr/bin/env python3
"""The torch engine on a GPU, in one run that fits 8 minutes: parity, throughput against the HBM roofline,
what the daemon costs, and bench/node.py on the real engine. One summary at the end (docs/gpu.md).

    python bench/gpu_check.py [--phases parity,throughput,daemon,node] [--deadline-s 450]
        [--shape 8b] [--batches 1,32,128,256] [--prompt-len 512] [--output-len 256] [--streams 256]

Phases, each a subprocess with its own deadline (a hung CUDA call cannot stall the run; its process
group is killed), in order:
  parity      a random Llama-3-shaped checkpoint: logits and greedy tokens against transformers on the
              device (float32 exact-ish, bfloat16 within transformers' own rounding): bench/gpu_parity.py
  throughput  the device's copy bandwidth, then the Llama-3-8B-shaped dummy-weight engine in process at
              each batch size (prompt 512, output 256, ignore_eos): tokens/s and the decode step against
              the roofline; then the streams workload (--requests, --streams in flight): bench/gpu_direct.py
  daemon      the same streams workload through `inferd serve`: daemon/direct tokens/s, the latency the
              front adds, and the KV blocks a dropped client frees: bench/gpu_daemon.py
  writers     the daemon phase again with SSE writer processes on ([server] front_processes =
              --front-processes: "auto" on CUDA, one per 4 CPUs up to 4; 1 on the CPU path)
  node        bench/node.py --backend torch: one engine in place of the sims, at its real step times
  generation  speculative decoding (prompt lookup, a draft model) and int8 weights on the torch engine, at
              `small`'s shapes: bench/gpu_generation.py
Without CUDA every phase runs on the CPU at a small shape in float32 (the first line says so), so the
script is tested everywhere. A failed phase prints its error line and the run goes on; the exit code is
1 if any phase failed. Wheels the GPU machine's image lacks: bench/gpu_wheels.sh.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PHASES = ("parity", "throughput", "daemon", "writers", "node", "generation")
TIMEOUTS = {"parity": 70, "throughput": 160, "daemon": 110, "writers": 110, "node": 110, "generation": 150}
CPU_DEFAULTS = {"shape": "small", "batches": "1,4,8", "prompt_len": 64, "output_len": 32, "streams": 8, "requests": 16,
                "dtype": "float32", "node_seconds": 4.0, "node_warmup": 3.0, "parity_tokens": 12, "bandwidth_mib": 256,
                "front_processes": "1"}
CUDA_DEFAULTS = {"shape": "8b", "batches": "1,32,128,256", "prompt_len": 512, "output_len": 256, "streams": 256,
                 "requests": 512, "dtype": "bfloat16", "node_seconds": 10.0, "node_warmup": 8.0, "parity_tokens": 24,
                 "bandwidth_mib": 2048, "front_processes": "auto"}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["main", "phase", "daemon"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--phases", default=",".join(PHASES), help="which phases, in this order")
    p.add_argument("--device", default=None, help="cuda / cuda:N / cpu (default: cuda when available)")
    p.add_argument("--shape", choices=["8b", "small"], help="model shape (default: 8b on CUDA, small on the CPU)")
    p.add_argument("--hidden", type=int, help="override the shape's hidden size (heads keep their head_dim)")
    p.add_argument("--layers", type=int, help="override the shape's layer count")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--batches", help="comma-separated batch sizes of the throughput phase")
    p.add_argument("--prompt-len", type=int)
    p.add_argument("--output-len", type=int)
    p.add_argument("--streams", type=int, help="streams in flight in the daemon comparison and node.py")
    p.add_argument("--requests", type=int, help="requests of the streams workload (direct and daemon)")
    p.add_argument("--max-num-tokens", type=int, default=8192, help="tokens per engine step (chunked prefill)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (every engine of every phase)")
    p.add_argument("--logs", type=Path, help="copy each phase's log, the daemon's and all results (one JSON) here")
    p.add_argument("--parity-tokens", type=int)
    p.add_argument("--bandwidth-mib", type=int, help="size of the buffer the bandwidth copy moves")
    p.add_argument("--node-seconds", type=float)
    p.add_argument("--node-warmup", type=float)
    p.add_argument("--front-processes", help='the writers phase\'s [server] front_processes: N or "auto"')
    p.add_argument("--no-early-refusal", action="store_true",
                   help="the daemon phases' [admission] early_refusal = false (a refused request is retried)")
    p.add_argument("--deadline-s", type=float, default=450.0, help="the whole run; a phase gets what is left")
    p.add_argument("--timeouts", default="", help="per phase, e.g. throughput=200,node=60 (defaults: "
                   + ",".join(f"{k}={v}" for k, v in TIMEOUTS.items()) + ")")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    defaults = CUDA_DEFAULTS if args.device.startswith("cuda") else CPU_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.batches = [int(b) for b in str(args.batches).split(",") if b]
    args.artifact_name = f"dummy-{args.shape}"
    return args


def shape_of(args):
    from gpu_models import shape_from

    return shape_from(args.shape, args.hidden, args.layers)


def parity_shape(args):
    from gpu_models import Shape

    if args.device.startswith("cuda"):     # head_dim 128 and 4 query heads per KV head, as Llama 3
        return Shape(hidden=1024, layers=4, heads=8, kv_heads=2, intermediate=2048, vocab=4096, max_position=2048)
    return Shape(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=1024, max_position=2048)


# -- a phase, in its own process -------------------------------------------------------------------
def run_phase(args: argparse.Namespace) -> dict:
    if args.phase == "parity":
        from gpu_parity import parity

        return asyncio.run(parity(args, parity_shape(args), args.work))
    if args.phase == "throughput":
        from gpu_direct import throughput

        return asyncio.run(throughput(args, shape_of(args), args.work))
    if args.phase in ("daemon", "writers"):
        import uvloop
        from gpu_daemon import daemon_phase

        writers = args.front_processes if args.phase == "writers" else "0"
        return uvloop.run(daemon_phase(args, shape_of(args), args.work, writers))
    if args.phase == "generation":
        from gpu_generation import generation

        return asyncio.run(generation(args, args.work))
    return run_node(args)


def run_node(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(HERE / "node.py"), "--backend", "torch", "--engines", "1", "--streams",
           str(args.streams), "--seconds", str(args.node_seconds), "--warmup", str(args.node_warmup), "--device",
           args.device, "--dtype", args.dtype, "--shape", args.shape, "--seed", str(args.seed + 7),
           "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    cmd += [f"--{k}={v}" for k, v in (("hidden", args.hidden), ("layers", args.layers)) if v]
    cmd += ["--enforce-eager"] if args.enforce_eager else []
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"node.py exited {out.returncode}: {out.stderr.strip()[-1500:]}")
    report = json.loads(out.stderr.strip().splitlines()[-1])
    report["lines"] = out.stdout.strip().splitlines()
    return report


def phase_main(args: argparse.Namespace) -> int:
    result = run_phase(args)
    (args.work / f"{args.phase}.json").write_text(json.dumps(result))
    return 0


# -- the run ------------------------------------------------------------------------------------------
def spawn_phase(args: argparse.Namespace, phase: str, argv: list[str], timeout: float) -> tuple[dict | None, str]:
    """(the phase's result, None) or (None, its error line). The phase runs in a process group of its own
    (not a session: whoever ends this run's session ends it too), so a timeout kills its daemon with it."""
    log = args.work / f"{phase}.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--role", "phase", "--phase", phase,
                                 "--work", str(args.work), *argv], stdout=err, stderr=subprocess.STDOUT,
                                preexec_fn=os.setpgrp)      # noqa: PLW1509 (no threads here yet)
        previous = signal.signal(signal.SIGTERM, lambda *_: _kill_group(proc, exit_code=143))
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None, f"timed out after {timeout:.0f} s; last output: {_tail(log)}"
        except KeyboardInterrupt:
            _kill_group(proc, exit_code=130)
        finally:
            signal.signal(signal.SIGTERM, previous)
    result_file = args.work / f"{phase}.json"
    if code != 0 or not result_file.is_file():
        return None, f"exited {code}: {_tail(log)}"
    return json.loads(result_file.read_text()), ""


def _kill_group(proc: subprocess.Popen, exit_code: int | None = None) -> None:
    """SIGKILL the phase's whole group (its daemon too); then exit with `exit_code` if one is given."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    if exit_code is not None:
        sys.exit(exit_code)


def keep_logs(args: argparse.Namespace, results: dict, errors: dict) -> None:
    """The phases' logs, the daemon's, and one JSON of every result, flat in --logs (a few files)."""
    args.logs.mkdir(parents=True, exist_ok=True)
    for log in args.work.glob("*.log"):
        shutil.copyfile(log, args.logs / f"gpu_check-{log.name}")
    (args.logs / "gpu_check-results.json").write_text(json.dumps({"results": results, "errors": errors}, indent=1))


def _tail(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-600:] or "(no output)"


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parse(raw)
    if args.role == "daemon":
        from daemon_process import run_daemon

        run_daemon(args.config)
        return 0
    if args.role == "phase":
        return phase_main(args)
    from gpu_summary import header, summary

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        sys.exit(f"unknown phase(s) {unknown}; choose from {', '.join(PHASES)}")
    timeouts = dict(TIMEOUTS, **{k: float(v) for k, v in (t.split("=") for t in args.timeouts.split(",") if t)})
    print(header(args, shape_of(args)), flush=True)
    started = time.monotonic()
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="inferd-gpu-check-") as tmp:
        args.work = Path(tmp)
        forwarded = [a for a in raw if not a.startswith("--role")]
        for phase in phases:
            left = args.deadline_s - (time.monotonic() - started)
            if left < 5:
                errors[phase] = "skipped: the run's deadline (--deadline-s) was reached"
                continue
            began = time.monotonic()
            result, error = spawn_phase(args, phase, forwarded, min(timeouts[phase], left))
            print(f"-- {phase}: {'ok' if result is not None else 'failed'} in {time.monotonic() - began:.0f} s",
                  file=sys.stderr, flush=True)
            if result is None:
                errors[phase] = error
            else:
                results[phase] = result
                if phase == "parity" and not result.get("ok"):
                    errors[phase] = "parity outside its tolerance (numbers above)"
        if args.logs:
            keep_logs(args, results, errors)
    lines = summary(args, results, errors, time.monotonic() - started)
    print("\n".join(lines), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
