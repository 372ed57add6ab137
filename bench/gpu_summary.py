"""bench/gpu_check.py's summary: one `name: value` line per figure, in phase order, with the goals beside
them (docs/gpu.md). A failed phase is one `<phase>: FAILED ...` line."""
from __future__ import annotations

import datetime
import platform
import subprocess

DAEMON_RATIO_GOAL = 0.97
ADDED_ITL_P99_GOAL_MS = 2.0
BATCH1_ROOFLINE_GOAL = 0.70
# within one step of the disconnect: the step in flight when the client left, and one more at most
DISCONNECT_STEPS_GOAL = 2


def header(args, shape) -> str:
    import torch

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.device.startswith("cuda"):
        where = f"CUDA {_gpu_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    else:
        where = (f"CPU path (no CUDA device: torch.cuda.is_available() is {torch.cuda.is_available()}); "
                 f"{platform.processor() or platform.machine()}, torch {torch.__version__}")
    return (f"gpu_check: {where}; shape {args.shape} ({shape.describe()}), {args.dtype}; "
            f"prompt {args.prompt_len}, output {args.output_len}; {when}")


def _gpu_name() -> str:
    """From nvidia-smi: asking torch would open a CUDA context in this process, held through every phase."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             check=False, capture_output=True, text=True, timeout=20)
        lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
        return lines[0] if lines else "(nvidia-smi: no GPU listed)"
    except (OSError, subprocess.TimeoutExpired):
        return "(no nvidia-smi)"


def _bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _goal(met: bool) -> str:
    return "met" if met else "MISSED"


def parity_lines(r: dict) -> list[str]:
    return [f"parity: {'ok' if r['ok'] else 'FAILED'} ({r['shape']})",
            f"parity logits float32 rel err: {r['logits_rel_err_float32']:.2e} (bound 1e-03)",
            (f"parity logits bfloat16 rel err: {r['logits_rel_err_bfloat16']:.2e} (bound {r['bf16_bound']:.1e}; "
            f"transformers' own bf16 {r['hf_bf16_rel_err']:.2e})"),
            (f"parity greedy float32: {'equal' if r['greedy_float32_equal'] else 'DIFFERENT'} "
            f"({r['greedy_float32_agreement']:.0%} of tokens agree)"),
            f"parity greedy bfloat16 agreement: {r['greedy_bfloat16_agreement']:.0%} (reported, not checked)"]


def throughput_lines(args, r: dict) -> list[str]:
    memory = "HBM, device-to-device copy" if args.device.startswith("cuda") else "host memcpy"
    lines = [f"bandwidth: {r['bandwidth_gb_s']:,.1f} GB/s ({memory}, bytes read + written)",
             (f"engine load: {r['load_s']} s ({_bytes(r['weight_bytes'])} weights, {r['kv_blocks']} KV blocks, "
             f"{r['hardware']})")]
    for b in r["batches"]:
        goal = ""
        if b["batch"] == 1 and args.device.startswith("cuda") and args.shape == "8b":
            goal = f"; goal >= {BATCH1_ROOFLINE_GOAL:.0%}: {_goal(b['roofline_share'] >= BATCH1_ROOFLINE_GOAL)}"
        lines.append(f"batch {b['batch']}: {b['tokens_per_s']:,.0f} tokens/s end to end, decode step "
                     f"{b['decode_step_ms']:.2f} ms ({b['decode_tokens_per_s']:,.0f} tokens/s), roofline "
                     f"{b['roofline_step_ms']:.2f} ms, roofline share {b['roofline_share']:.0%}{goal}")
    s = r["streams"]
    lines.append(f"direct streams: {s['tokens_per_s']:,.0f} tokens/s ({s['requests']} requests, {s['streams']} in "
                 f"flight), ITL p50 {s['itl_p50_ms']:.2f} ms p99 {s['itl_p99_ms']:.2f} ms")
    return lines


def daemon_lines(r: dict, direct: dict | None) -> list[str]:
    lines = [f"writers: {r['writers']} SSE writer process(es) ([server] front_processes = {r['front_processes']})"
             ] if r.get("front_processes", "0") != "0" else []
    if direct:
        ratio = r["tokens_per_s"] / direct["tokens_per_s"]
        lines.append(f"daemon/direct tokens/s: {ratio:.3f} ({r['tokens_per_s']:,.0f} / {direct['tokens_per_s']:,.0f} "
                     f"at {r['streams']} streams; goal >= {DAEMON_RATIO_GOAL}: {_goal(ratio >= DAEMON_RATIO_GOAL)})")
    else:
        lines.append(f"daemon tokens/s: {r['tokens_per_s']:,.0f} at {r['streams']} streams (no direct figure: the "
                     f"throughput phase did not run)")
    p99 = r["added_itl_p99_ms"]
    lines.append(f"added ITL p99: {p99:.2f} ms (p50 {r['added_itl_p50_ms']:.2f}; token pushed -> frame written; "
                 f"goal <= {ADDED_ITL_P99_GOAL_MS:g} ms: {_goal(p99 <= ADDED_ITL_P99_GOAL_MS)})")
    itl = f"client ITL p50 {r['client_itl_p50_ms']:.2f} ms p99 {r['client_itl_p99_ms']:.2f} ms"
    if direct:
        itl += f" (direct p50 {direct['itl_p50_ms']:.2f} p99 {direct['itl_p99_ms']:.2f})"
    lines.append(f"daemon {itl}; load {r['load_s']} s")
    if r.get("refused") or r.get("cut"):
        lines.append(f"daemon refusals: {r['refused']} refused and retried (first: {r['first_refusal'][:300]}); "
                     f"{r['cut']} streams cut short (first: {r['first_cut'][:300]})")
    d = r["disconnect"]
    past = d["tokens_after_disconnect"]
    lines.append(f"disconnect: {d['blocks_held']} KV blocks freed; {past} token(s) generated past the last one the "
                 f"client had when it went (one per step: the one in flight, then any before the abort landed; "
                 f"goal <= {DISCONNECT_STEPS_GOAL}: {_goal(past <= DISCONNECT_STEPS_GOAL)}); seen in /metrics "
                 f"{d['freed_ms']:.1f} ms after the drop, scrapes included (step {d['step_ms']:.2f} ms)")
    return lines


def summary(args, results: dict, errors: dict, elapsed: float) -> list[str]:
    lines = ["-- summary --"]
    direct = results.get("throughput", {}).get("streams")
    for phase in [p.strip() for p in args.phases.split(",") if p.strip()]:
        r = results.get(phase)
        try:
            if phase == "parity" and r:
                lines += parity_lines(r)
            elif phase == "throughput" and r:
                lines += throughput_lines(args, r)
            elif phase == "daemon" and r:
                lines += daemon_lines(r, direct)
            elif phase == "writers" and r:
                lines += [f"writers {line}" if not line.startswith("writers:") else line
                          for line in daemon_lines(r, direct)]
            elif phase == "node" and r:
                lines += [f"node.py: {line}" for line in r["lines"]]
            elif phase == "generation" and r:
                from gpu_generation import generation_lines

                lines += generation_lines(r)
        except (KeyError, TypeError, ZeroDivisionError) as exc:      # a result missing a figure
            errors.setdefault(phase, f"its result lacks {exc!r}")
        if phase in errors and not (phase == "parity" and r):
            lines.append(f"{phase}: FAILED {errors[phase]}")
    ok = [p for p in results if p not in errors]
    lines.append(f"phases: {len(ok)} ok, {len(errors)} failed ({elapsed:.0f} s)")
    return lines
