"""A whole GPU node in one inferd: --engines sim engines at real step times, --streams each, and what the
front end costs them.

    .venv/bin/python bench/node.py [--engines 8] [--streams 256] [--seconds 10] [--warmup 5]
    .venv/bin/python bench/node.py --backend torch [--device cuda] [--shape 8b] [--streams 256]

`--backend torch` runs one torch engine (backend = "torch", random weights of --shape's Llama 3 shape,
`load_format = "dummy"`) in place of the sims: real step times on the GPU (or the CPU, at --shape small),
the same load and figures; the step seconds are then the engine's own wall time, so the first figure reads
delivered/engine tokens/s. The daemon may then use every CPU but the client's (a GPU engine's step thread
and the CUDA driver's threads run beside the event loop).

1. One daemon (a subprocess pinned to CPU 0, as `inferd serve` runs it) with --engines models sim0.. each a
   `llama3-8b-h100` sim engine at time_scale 1 (steps take what the profile's roofline says an H100
   takes), max_batch_size --streams.
2. One load generator (a subprocess pinned to CPU 1; --clients N: N of them on CPUs 1..N, sharing the
   streams, for a machine whose one generator would set the pace) keeps --streams streaming completions
   open per engine, each started when one ends. Each prompt has 16..256 words (about 50..770 tokens) and each
   output 128..1024 tokens (log-uniform, seeded, `ignore_eos`): chat-like, decode-heavy. Every chunk carries the usage so far
   (`stream_options.continuous_usage_stats`), so the client knows how many tokens each arrival brought.
3. In the measuring window (after --warmup) the daemon's /metrics is read at both ends. It gives each
   engine's steps, the simulated seconds they took (inferd_engine_step_seconds) and the tokens they
   generated (inferd_engine_generated_tokens).

It prints:
- `delivered/simulated tokens/s`: tokens the clients received in the window, over what the engines would
  produce in it at their simulated step times with nothing in the way (window x each engine's tokens per
  simulated second). Below 1 when the front delays the steps or the clients' tokens.
- `added ITL p99`: the latency the front adds to a token: from the engine pushing it to the frame that
  carries it being written (the daemon's inferd_stream_write_delay_seconds, one observation per frame,
  of its oldest token; quantiles as Prometheus' histogram_quantile). On loopback the client reads it
  microseconds later. What the front costs the engines themselves (steps run late on a busy loop) shows
  in the first figure instead. The client's own ITL (each arrival's gap over its tokens) is printed
  beside it, with the engines' mean simulated step.
- `server CPU per 1k tokens`: every server process's CPU together (the daemon and all under it), the
  server's and client's CPU use, and the load average before and after.
- `<role> process CPU per 1k tokens`, per process role (bench/process_cpu.py: the daemon itself is
  `engine`; processes under it name their role in their title), from /proc/<pid>/stat at both ends of
  the window over the tokens the clients received; a role with several processes gives the mean per
  process and their count. Then `projected node throughput`: the cores each role needs for a node's
  225,000 tokens/s, and the tokens/s one core of the engine process carries. CPU time per process
  shows on any machine what a bigger one will do with more cores.
A client process near 100% CPU means the load generator, not the daemon, set the pace: the figure is
then a floor. `--client-nice 10` runs the load generators at that niceness: on a machine where a writer
process shares its CPU with one (2 cores), the writer then runs first whenever both are ready, as on a node
where the clients are elsewhere; at the same priority each frame's wake-up of the client could take the CPU
from the writer in the middle of a step's frames, and the added ITL measured that contention too.
Loopback only; the window and every phase are bounded.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

from daemon_metrics import gc_window, histogram_quantile, percentile, scrape  # noqa: E402 (bench/ is this script's own directory)
from daemon_process import pin, place_writers, run_daemon, spawn, stop  # noqa: E402
from process_cpu import per_1k_tokens, projection, role_lines, sample_tree, window_cpu  # noqa: E402
from sse_load import Refused, SseClient, http_post, reuse  # noqa: E402

SERVER_CPU, CLIENT_CPU = 0, 1
MODEL = """
[models.sim{i}]
backend = "sim"
max_batch_size = {streams}
max_num_tokens = 8192
num_kv_blocks = {blocks}
[models.sim{i}.sim]
profile = "llama3-8b-h100"
time_scale = 1.0
max_model_len = 4096
"""
CONFIG = """
[server]
host = "127.0.0.1"
port = 0
log_level = "warning"
heartbeat_interval_s = 15.0
max_connections = {connections}

[tenants.local]
max_concurrent_requests = {total}

[admission]
max_engine_waiting = {streams}
"""
TORCH_MODEL = """
[models.torch{i}]
backend = "torch"
artifact = "{artifact}"
max_batch_size = {streams}
max_num_tokens = 8192
max_model_len = {max_model_len}
{blocks}
[models.torch{i}.torch]
device = "{device}"
dtype = "{dtype}"
load_format = "dummy"
gpu_memory_utilization = {utilization}
cuda_graphs = {graphs}
"""
WORDS = [f"w{i}" for i in range(2000)]


# -- the load generator ----------------------------------------------------------------------------
class _Stream(SseClient):
    """bench/sse_load.py's client connection, noting each arrival's gap and the tokens it brought (from the
    running usage), inside the measuring window."""

    _TOKENS = re.compile(rb'"completion_tokens":(\d+)')

    def __init__(self, log: tuple[array, array, array], counted: list[int], engine: int,
                 window: tuple[float, float]) -> None:
        super().__init__()
        self.log, self.counted, self.engine, self.window = log, counted, engine, window
        self.tokens = 0
        self.last: float | None = None

    def start(self, request: bytes) -> asyncio.Future:
        self.tokens, self.last = 0, None
        return super().start(request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        found = self._TOKENS.findall(self.tail[-40:] + data)
        if found:
            count = int(found[-1])
            if count > self.tokens:
                if self.window[0] <= now < self.window[1]:
                    self.counted[0] += count - self.tokens
                    if self.last is not None:
                        gaps, ks, engines = self.log
                        gaps.append(now - self.last)
                        ks.append(count - self.tokens)
                        engines.append(self.engine)
                self.tokens, self.last = count, now
        self._received(data)


def _request(port: int, model: str, rng: random.Random) -> bytes:
    prompt_words = int(16 * 16 ** rng.random())          # 16..256 words (~50..770 tokens), log-uniform
    return http_post(port, {"model": model, "prompt": " ".join(rng.choices(WORDS, k=prompt_words)),
                            "max_tokens": int(128 * 8 ** rng.random()), "ignore_eos": True, "temperature": 0,
                            "stream": True,
                            "stream_options": {"include_usage": True, "continuous_usage_stats": True}})


async def load(args: argparse.Namespace, out: Path) -> dict:
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    window = (t0 + args.warmup, t0 + args.warmup + args.seconds)
    log = (array("d"), array("I"), array("B"))
    totals = {"requests": 0, "errors": 0, "refused": 0, "first_refusal": "", "first_error": ""}
    counted = [0]           # tokens that arrived in the window, every stream's

    async def worker(i: int) -> None:
        rng = random.Random(args.seed * 100_003 + i)
        engine = i % args.engines
        def connection() -> _Stream:
            return _Stream(log, counted, engine, window)

        _, proto = await loop.create_connection(connection, "127.0.0.1", args.port)
        try:
            while time.monotonic() < window[1]:
                try:
                    proto = await reuse(proto, connection, args.port)
                    await proto.start(_request(args.port, f"{args.backend}{engine}", rng))
                except Refused as refusal:      # honest backpressure: wait as Retry-After says, then again
                    totals["refused"] += 1
                    totals["first_refusal"] = totals["first_refusal"] or str(refusal)[:300]
                    await asyncio.sleep(refusal.wait_s)
                    continue
                except ConnectionError as error:
                    totals["errors"] += 1
                    totals["first_error"] = totals["first_error"] or str(error)[:300]
                    return
                totals["requests"] += 1
        finally:
            proto.transport.close()

    mine = range(args.client_index, args.engines * args.streams, args.clients)     # this generator's share
    workers = [asyncio.ensure_future(worker(i)) for i in mine]
    await asyncio.sleep(window[1] - time.monotonic())
    for w in workers:          # the window is over; requests still running are cut off
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    gaps, ks, engines = log
    (out / f"gaps{args.client_index}.bin").write_bytes(gaps.tobytes())
    (out / f"ks{args.client_index}.bin").write_bytes(ks.tobytes())
    (out / f"engines{args.client_index}.bin").write_bytes(engines.tobytes())
    return {"client_tokens_per_s": counted[0] / args.seconds, "arrivals": len(gaps), **totals}


def read_arrivals(out: Path, clients: int) -> tuple[array, array]:
    """The load generators' logs of the window's arrivals: each one's gap since the last, and its tokens."""
    gaps, ks = array("d"), array("I")
    for k in range(clients):
        gaps.frombytes((out / f"gaps{k}.bin").read_bytes())
        ks.frombytes((out / f"ks{k}.bin").read_bytes())
    return gaps, ks


def client_cpus(clients: int) -> list[int]:
    """One CPU per load generator, after the daemon's: CPU 1, 2, ... (wrapping round on a small machine)."""
    cpus = os.cpu_count() or 1
    return [CLIENT_CPU + k % max(1, cpus - CLIENT_CPU) for k in range(clients)]


def merge_clients(outputs: list[str]) -> dict:
    """The load generators' JSON results as one: counts summed, CPU use as the busiest generator's."""
    results = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    merged = {key: sum(r[key] for r in results)
              for key in ("client_tokens_per_s", "requests", "errors", "arrivals", "refused")}
    for key in ("first_refusal", "first_error"):
        merged[key] = next((r[key] for r in results if r[key]), "")
    merged["client_cpu_util"] = max(r["client_cpu_util"] for r in results)
    merged["client_nice"] = max(r["client_nice"] for r in results)
    merged["clients"] = len(results)
    return merged


def run_client(args: argparse.Namespace) -> None:
    import uvloop

    cpu0, t0 = time.process_time(), time.monotonic()
    result = uvloop.run(load(args, Path(args.out)))
    result["client_cpu_util"] = (time.process_time() - cpu0) / (time.monotonic() - t0)
    result["client_nice"] = os.nice(0)
    print(json.dumps(result), flush=True)


# -- orchestration ---------------------------------------------------------------------------------
def main() -> int:
    args = parse()
    if args.role == "daemon":
        run_daemon(args.config)
        return 0
    if args.role == "client":
        run_client(args)
        return 0
    total = args.engines * args.streams
    blocks = args.streams * (800 + 1024) // 16 + 64          # every stream's longest prompt and output
    with tempfile.TemporaryDirectory(prefix="inferd-node-") as tmp:
        work = Path(tmp)
        config = work / "inferd.toml"
        models = ("".join(MODEL.format(i=i, streams=args.streams, blocks=blocks) for i in range(args.engines))
                  if args.backend == "sim" else torch_models(args, work))
        server = CONFIG.format(connections=total + 64, total=total, streams=args.streams)
        server = server.replace("[server]\n", f"[server]\nfront_processes = {args.front_processes}\n", 1)
        if args.backend == "torch":
            server = server.replace("[server]\n", f'[server]\nengines_root = "{work / "engines"}"\n', 1)
        config.write_text(server + models)
        load_before = os.getloadavg()
        server_cpu = SERVER_CPU if args.backend == "sim" else None
        proc, started = spawn([__file__, "--role", "daemon", "--config", str(config)], work, "daemon.log", server_cpu)
        cpus = client_cpus(args.clients)
        if server_cpu is None and hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > max(cpus) + 1:
            os.sched_setaffinity(proc.pid, set(range(os.cpu_count())) - set(cpus))
        if server_cpu is not None:
            place_writers(proc.pid, server_cpu, set(cpus))
        port = started["port"]
        try:
            cmd = [sys.executable, __file__, "--role", "client", "--port", str(port), "--engines", str(args.engines),
                   "--streams", str(args.streams), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                   "--seed", str(args.seed), "--out", str(work), "--backend", args.backend,
                   "--clients", str(args.clients)]
            clients = [subprocess.Popen([*cmd, "--client-index", str(k)], stdout=subprocess.PIPE, text=True,
                                        preexec_fn=lambda cpu=cpu: (pin(cpu), os.nice(args.client_nice)))
                       for k, cpu in enumerate(cpus)]
            time.sleep(args.warmup)
            (m0, d0, gc0), tree0, t0 = scrape(port), sample_tree(proc.pid), time.monotonic()
            time.sleep(args.seconds)
            (m1, d1, gc1), tree1, t1 = scrape(port), sample_tree(proc.pid), time.monotonic()
            outputs = [c.communicate(timeout=args.seconds + args.warmup + 120)[0] for c in clients]
            if any(c.returncode != 0 for c in clients):
                raise RuntimeError("a load generator failed")
            result = merge_clients(outputs)
        finally:
            stop(proc)
        load_after = os.getloadavg()
        window = t1 - t0
        simulated, step_s, step_cpu = 0.0, {}, 0.0
        for model in m1:
            d = {k: m1[model][k] - m0.get(model, {}).get(k, 0.0) for k in m1[model]}
            step_cpu += d.get("inferd_engine_step_cpu_seconds_total", 0.0)
            sim_s, steps, gen = (d["inferd_engine_step_seconds_sum"], d["inferd_engine_step_seconds_count"],
                                 d["inferd_engine_generated_tokens_total"])
            if sim_s > 0 and steps > 0:
                simulated += window * gen / sim_s
                step_s[int(re.sub(r"\D", "", model))] = sim_s / steps
        gaps, ks = read_arrivals(work, args.clients)
    itl: list[float] = []                                   # the client's ITL: each arrival's gap over its tokens
    for gap, k in zip(gaps, ks):
        itl.extend([gap / k * 1000] * min(k, 64))
    itl.sort()
    delay = {b: d1.get(b, 0.0) - d0.get(b, 0.0) for b in d1}
    delivered = result["client_tokens_per_s"]
    tokens_in_window = sum(ks)
    per_role = window_cpu(tree0, tree1)
    server_cpu = sum(sum(seconds) for seconds in per_role.values())
    roles = per_1k_tokens(per_role, delivered * window)
    report = {**result, "window_s": window, "delivered_tokens_per_s": delivered,
              "simulated_tokens_per_s": simulated / window, "ratio": delivered / (simulated / window),
              "tokens_per_arrival": tokens_in_window / max(1, len(gaps)),
              "mean_step_ms": {e: round(s * 1000, 3) for e, s in sorted(step_s.items())},
              "added_itl_ms": {q: histogram_quantile(v, delay) * 1000 for q, v in
                               (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
              "client_itl_ms": {"p50": percentile(itl, 0.50), "p99": percentile(itl, 0.99)},
              "server_cpu_util": server_cpu / window,
              "server_cpu_ms_per_1k_tokens": server_cpu * 1000 / max(1.0, delivered * window) * 1000,
              "roles": roles, "projection": projection(roles), "gc": gc_window(gc0, gc1),
              "step_loop_ms_per_1k_tokens": step_cpu * 1000 / max(1.0, delivered * window) * 1000,
              "loadavg_before": load_before, "loadavg_after": load_after}
    print(json.dumps(report), file=sys.stderr)
    print_summary(args, report, step_s)
    return 0


def print_summary(args: argparse.Namespace, report: dict, step_s: dict[int, float]) -> None:
    """The summary lines (stdout) of one run's report; tests/bench/test_node.py and docs/performance.md read them."""
    if args.backend == "sim":
        print(f"node: {args.engines} sim engines (llama3-8b-h100, real time) x {args.streams} streams, "
              f"{report['window_s']:.1f} s window")
    else:
        print(f"node: {args.engines} torch engine ({args.shape} shape, {args.dtype}, {args.device}, dummy weights) x "
              f"{args.streams} streams, {report['window_s']:.1f} s window")
    label = "delivered/simulated" if args.backend == "sim" else "delivered/engine"
    print(f"{label} tokens/s: {report['ratio']:.3f} ({report['delivered_tokens_per_s']:,.0f} / "
          f"{report['simulated_tokens_per_s']:,.0f}); {report['tokens_per_arrival']:.2f} tokens per arrival")
    a = report["added_itl_ms"]
    c = report["client_itl_ms"]
    print(f"added ITL p99: {a['p99']:.2f} ms (p50 {a['p50']:.2f}, p90 {a['p90']:.2f}: token pushed -> frame written, "
          f"inferd_stream_write_delay_seconds); client ITL p50 {c['p50']:.1f} p99 {c['p99']:.1f} ms, mean "
          f"{'simulated ' if args.backend == 'sim' else 'engine '}"
          f"step {sum(step_s.values()) / max(1, len(step_s)) * 1000:.2f} ms")
    print(f"server CPU per 1k tokens: {report['server_cpu_ms_per_1k_tokens']:.2f} ms (server CPU "
          f"{report['server_cpu_util']:.0%}, client CPU {report['client_cpu_util']:.0%}"
          f"{' (the busiest of %d generators)' % report['clients'] if report['clients'] > 1 else ''}"
          f"{' at nice %d' % report['client_nice'] if report['client_nice'] else ''}, "
          f"errors {report['errors']})")
    if report["refused"] or report["errors"]:
        print(f"refused: {report['refused']} (retried; first: {report['first_refusal'] or '-'}); errors: "
              f"{report['errors']} (first: {report['first_error'] or '-'})")
    print("\n".join(role_lines(report["roles"], report["projection"])))
    loops, engine = report["step_loop_ms_per_1k_tokens"], report["roles"]["engine"]["ms_per_1k_tokens"]
    print(f"engines' step loops CPU per 1k tokens: {loops:.2f} ms (of the engine process's {engine:.2f}; the rest: "
          f"{engine - loops:.2f}; inferd_engine_step_cpu_seconds_total)")
    print(gc_line(report["gc"], report["window_s"]))
    print("load average (1, 5, 15 min) before {:.2f} {:.2f} {:.2f}, after {:.2f} {:.2f} {:.2f}".format(
        *report["loadavg_before"], *report["loadavg_after"]))


def gc_line(gc: dict[str, dict], window_s: float) -> str:
    """The engine process's garbage collector in the window (inferd_gc_pause_seconds)."""
    seconds = sum(g["seconds"] for g in gc.values())
    full = gc.get("2", {"collections": 0, "longest_under_s": None})
    longest = max((g["longest_under_s"] for g in gc.values() if g["longest_under_s"] is not None), default=None)
    return (f"engine process GC pauses: {sum(g['collections'] for g in gc.values())} collections "
            f"({full['collections']} full), {seconds * 1000:.0f} ms in all ({seconds / window_s:.1%} of the window), "
            f"the longest under {'-' if longest is None else '%g ms' % (longest * 1000)}")


def torch_models(args: argparse.Namespace, work: Path) -> str:
    """The [models.torch0] table over a dummy-weight artifact of --shape, built into work/engines."""
    from gpu_models import dummy_artifact, shape_from

    if args.engines != 1:
        raise SystemExit("--backend torch runs one engine (one GPU): --engines 1")
    shape = shape_from(args.shape, args.hidden, args.layers)
    name = f"dummy-{args.shape}"
    dummy_artifact(work / "engines", name, shape)
    max_model_len = min(shape.max_position, 4096)
    blocks = "" if args.device.startswith("cuda") else f"num_kv_blocks = {args.streams * max_model_len // 16 + 64}"
    return TORCH_MODEL.format(
        i=0, artifact=name, streams=args.streams, max_model_len=max_model_len, blocks=blocks, device=args.device,
        dtype=args.dtype, utilization=args.gpu_memory_utilization, graphs=str(not args.enforce_eager).lower())


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["main", "daemon", "client"], default="main")
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--streams", type=int, default=256, help="concurrent streams per engine")
    p.add_argument("--seconds", type=float, default=10.0, help="measuring window")
    p.add_argument("--warmup", type=float, default=8.0, help="before the window: the first prefills settle")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--clients", type=int, default=1,
                   help="load generator processes, each on its own CPU after the daemon's (CPU 1, 2, ...)")
    p.add_argument("--client-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--client-nice", type=int, default=0, choices=range(0, 20), metavar="0..19",
                   help="the load generators' niceness (10: a writer sharing their CPU runs first)")
    p.add_argument("--front-processes", type=int, default=0,
                   help="[server] front_processes: SSE writer processes (0: every stream written in the daemon)")
    p.add_argument("--backend", choices=["sim", "torch"], default="sim",
                   help="sim: --engines simulated engines; torch: one torch engine (dummy weights)")
    p.add_argument("--device", default="cuda", help="torch: cuda / cuda:N / cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="torch")
    p.add_argument("--shape", default="8b", choices=["8b", "small"], help="torch: Llama 3 8B's shape, or a small one")
    p.add_argument("--hidden", type=int, help="torch: override the shape's hidden size")
    p.add_argument("--layers", type=int, help="torch: override the shape's layer count")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="torch on CUDA")
    p.add_argument("--enforce-eager", action="store_true", help="torch: no CUDA graphs")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(main())
