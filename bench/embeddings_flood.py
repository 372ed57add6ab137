"""Embeddings flood benchmark: interactive chat TTFT on a node alone, and while another tenant
floods POST /v1/embeddings on the same node.

    .venv/bin/python bench/embeddings_flood.py [--seconds 10] [--chat-clients 8] [--flood-clients 16]
        [--inputs 64] [--input-tokens 100] [--encoding base64|float] [--ignore-retry-after]
        [--bulk-max-queued N] [--py-spy DIR]

The issue's promise: "embeddings and generation on the same node never starve each other". Setup:
  0. Two sim models on one node (a GPU node's shape: engine time is simulated, the daemon's CPU is the
     front end's): `chat` (Llama 3 8B on an H100, real time) and `embed` (task = "embed",
     e5-mistral-7b on an H100, real time, its deadline-aware batcher aiming at 50 ms). Tenants `chat`
     (priority interactive) and `bulk` (standard, default limits unless --bulk-max-queued). The
     config is checked with `inferd check-config`; API keys come from `inferd keys create` (and a
     metrics-scoped one for /metrics).
  1. The daemon (inferd.daemon.Daemon in a subprocess, uvloop, auth on) pinned to CPU 0; this
     script, the clients, pinned to CPU 1. Loopback only.
  2. Warm-up (--warmup s): chat streams, then two embedding requests; not measured.
  3. `alone`: --chat-clients closed-loop clients of tenant `chat`, each streaming a chat completion (a
     short prompt, --max-tokens tokens) after another; per request the TTFT (to the first SSE chunk
     carrying content) and the end-to-end time.
  4. `flood`: the same, while --flood-clients closed-loop clients of tenant `bulk` send /v1/embeddings
     requests of --inputs inputs of ~--input-tokens tokens each, as fast as they are answered; a
     429/503 is retried after its Retry-After (as the official SDKs do), or at once with
     --ignore-retry-after (a misbehaving client: the daemon then spends its CPU refusing).
  Each phase runs --settle s unmeasured (clients fall out of step, the flood reaches its steady
  state), then --seconds measured; every loop stops itself at its end time.
It prints JSON and a summary: chat TTFT and end-to-end p50/p99 and request count per phase, the p99
TTFT ratio flood/alone (the verdict compares it with RATIO_GOAL), the flood's requests, statuses and
inputs per second (delivered in 200s, and computed by the engine: more when inputs of refused
requests still ran), the daemon's and the clients' CPU use per phase, and per-phase deltas of the
daemon's own series (/metrics: TTFT, queue wait, prefill, step time, stream write delay, e2e per
model; the batcher's batch size, fill, wait and compute; refusals per tenant and reason), which say
where the time went when the ratio is high. --py-spy DIR also samples the daemon in each measured
window. Run it against another checkout with PYTHONPATH=that/checkout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from daemon_process import cpu_seconds, create_key, daemon_or_bench, spawn  # noqa: E402 (bench/ is this script's own directory)

SERVER_CPU, CLIENT_CPU = 0, 1
RATIO_GOAL = 1.5            # the p99 TTFT ratio flood/alone this bench calls "not starved"

CONFIG = """
[server]
host = "127.0.0.1"
port = 0
log_level = "warning"

[auth]
mode = "api_key"
keys_file = "keys.jsonl"

[audit]
path = "audit.jsonl"

[models.chat]
backend = "sim"
max_batch_size = 64
max_num_tokens = 8192

[models.chat.sim]
profile = "llama3-8b-h100"
time_scale = 1.0

[models.embed]
backend = "sim"
task = "embed"
max_batch_size = 32
max_num_tokens = 4096

[models.embed.sim]
profile = "e5-mistral-7b-h100"
time_scale = 1.0

[models.embed.batching]
latency_target_ms = 50

[tenants.chat]
priority = "interactive"

[tenants.bulk]
{bulk}"""
CHAT_MESSAGES = [{"role": "user", "content": "Write a haiku about the sea in autumn."}]
WORDS = ("the of and to in is that it was for on are as with his they at be this from have or by one had not "
         "but what all were when we there can an your which their said if do will each about how up out them "
         "model token server request stream queue tenant engine batch cache block prompt answer question").split()
HISTOGRAMS = ("inferd_time_to_first_token_seconds", "inferd_queue_wait_seconds", "inferd_admission_queue_wait_seconds",
              "inferd_prefill_seconds", "inferd_engine_step_seconds", "inferd_stream_write_delay_seconds",
              "inferd_e2e_request_latency_seconds", "inferd_embedding_batch_size",
              "inferd_embedding_batch_fill_ratio", "inferd_embedding_batch_wait_seconds",
              "inferd_embedding_compute_seconds")
COUNTERS = ("inferd_requests", "inferd_embedding_deadline_misses", "inferd_tenant_rejections")


def quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def embedding_texts(count: int, tokens: int, seed: int) -> list[str]:
    """`count` different texts of about `tokens` tokens each (as the sim's tokenizer counts them)."""
    from inferd.engine.sim.profiles import get_profile, sim_tokenizer

    tok = sim_tokenizer(get_profile("e5-mistral-7b-h100").vocab_size)
    rng = random.Random(seed)
    sample = " ".join(rng.choice(WORDS) for _ in range(200))
    words_per_token = 200 / len(tok.encode(sample, add_special_tokens=False))
    n = max(1, round(tokens * words_per_token))
    return [" ".join(rng.choice(WORDS) for _ in range(n)) for _ in range(count)]


def start_daemon(workdir: Path, bulk_max_queued: int | None) -> tuple[subprocess.Popen, dict]:
    config = workdir / "inferd.toml"
    config.write_text(CONFIG.format(bulk="" if bulk_max_queued is None else
                                    f"max_queued_requests = {bulk_max_queued}\n"))
    check = subprocess.run([sys.executable, "-m", "inferd", "check-config", str(config)], cwd=workdir,
                           capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        raise RuntimeError(f"check-config failed: {check.stdout}{check.stderr}")
    keys = {name: create_key(config, tenant, scope, cwd=workdir) for name, tenant, scope in (
        ("chat", "chat", "inference"), ("bulk", "bulk", "inference"), ("metrics", "chat", "metrics"))}
    proc, started = spawn([__file__, "--role", "daemon", "--config", str(config)], workdir, "daemon.log", SERVER_CPU)
    return proc, {**started, "keys": keys, "check_config": check.stdout.strip().splitlines()[-1:]}


# -- the daemon's own view: /metrics deltas per phase -------------------------------------------------
async def scrape(http, base: str, key: str) -> dict:
    """{(series name, labels...): value} of the histograms' buckets/sums/counts and the counters we read."""
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(base + "/metrics", headers={"Authorization": f"Bearer {key}"}) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"/metrics: {resp.status} {text[:200]}")
    out: dict = {}
    for family in text_string_to_metric_families(text):
        if family.name not in HISTOGRAMS and family.name not in COUNTERS:
            continue
        for s in family.samples:
            labels = dict(s.labels)
            who = labels.pop("model", "") or (f"tenant {labels['tenant']}" if "tenant" in labels else "")
            key_ = (s.name, who, labels.pop("le", ""), labels.pop("status", ""), labels.pop("reason", ""))
            out[key_] = out.get(key_, 0.0) + s.value
    return out


def _bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) pairs."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = upper, count
    return lower


def metric_deltas(before: dict, after: dict) -> dict:
    """Per model (or tenant): each histogram's count, mean, p50 and p99 (from its buckets; a summary has
    none) over the phase; the counters' increments."""
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    out: dict = {}
    for name in HISTOGRAMS:
        for model in sorted({k[1] for k in delta if k[0] == name + "_count"}):
            count = delta.get((name + "_count", model, "", "", ""), 0.0)
            if count <= 0:
                continue
            total = delta.get((name + "_sum", model, "", "", ""), 0.0)
            buckets = sorted(((float("inf") if k[2] in ("+Inf", "inf") else float(k[2])), v)
                             for k, v in delta.items() if k[0] == name + "_bucket" and k[1] == model)
            scale = 1000.0 if name.endswith("_seconds") else 1.0
            unit = "_ms" if name.endswith("_seconds") else ""
            p50, p99 = _bucket_quantile(buckets, 0.5), _bucket_quantile(buckets, 0.99)
            row = {"count": int(count), "mean" + unit: round(scale * total / count, 3)}
            if buckets:
                row.update({"p50" + unit: None if p50 is None else round(scale * p50, 3),
                            "p99" + unit: None if p99 is None else round(scale * p99, 3)})
            out.setdefault(model, {})[name.removeprefix("inferd_").removesuffix("_seconds")] = row
    for k, v in delta.items():
        if v and k[0] == "inferd_requests_total":
            out.setdefault(k[1], {}).setdefault("requests_by_status", {})[k[3]] = int(v)
        elif v and k[0] == "inferd_tenant_rejections_total":
            out.setdefault(k[1], {}).setdefault("rejections", {})[k[4]] = int(v)
        elif v and k[0] == "inferd_embedding_deadline_misses_total":
            out.setdefault(k[1], {}).setdefault("deadline_misses", {})[k[4]] = int(v)
    return out


# -- the clients --------------------------------------------------------------------------------------
async def chat_client(http, url: str, key: str, body: bytes, end: float, out: list) -> None:
    """Streaming chat completions one after another until `end`: (started, ttft, e2e, status) each,
    `started` on the monotonic clock. SSE is parsed by hand (cheaper than the SDK on the client CPU):
    the first `data:` line with non-empty content is the first token."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    while (started := time.monotonic()) < end:
        t0 = time.perf_counter()
        ttft = None
        async with http.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                out.append((started, None, time.perf_counter() - t0, resp.status))
                await asyncio.sleep(0.05)
                continue
            async for line in resp.content:
                if ttft is None and line.startswith(b"data: {") and b'"content":"' in line \
                        and b'"content":""' not in line:
                    ttft = time.perf_counter() - t0
        out.append((started, ttft, time.perf_counter() - t0, 200))


async def flood_client(http, url: str, key: str, body: bytes, inputs: int, stop_at: asyncio.Event,
                       out: list, honor_retry_after: bool) -> None:
    """Embedding requests one after another until `stop_at`: (finished at, seconds, status, inputs,
    prompt tokens) each. Refusals are retried at once, as a careless bulk client does (the worst case
    for the daemon), or after their Retry-After (capped at 5 s) with `honor_retry_after`."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    while not stop_at.is_set():
        t0 = time.perf_counter()
        async with http.post(url, data=body, headers=headers) as resp:
            payload = await resp.read()
        tokens = 0
        if resp.status == 200:
            usage = json.loads(payload).get("usage") or {}
            tokens = usage.get("prompt_tokens", 0)
        out.append((time.monotonic(), time.perf_counter() - t0, resp.status, inputs, tokens))
        retry = resp.headers.get("Retry-After")
        if honor_retry_after and resp.status in (429, 503) and retry is not None:
            try:
                await asyncio.wait_for(stop_at.wait(), min(5.0, float(retry)))
            except asyncio.TimeoutError:
                pass


def start_py_spy(directory: Path | None, pid: int, name: str, seconds: float) -> list[subprocess.Popen]:
    """py-spy sampling the daemon for the measured part of a phase (--py-spy DIR): raw collapsed stacks
    of what holds the GIL (DIR/<phase>.gil.raw) and of every thread, idle or not (DIR/<phase>.all.raw).
    Non-blocking sampling, so the daemon is not paused; py-spy runs on CPU 1 with the clients."""
    if directory is None:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).with_name("py-spy"))
    common = ["record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "100", "-f", "raw", "--threads",
              "--nonblocking"]
    return [subprocess.Popen([spy, *common, flag, "-o", str(directory / f"{name}.{kind}.raw")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for kind, flag in (("gil", "--gil"), ("all", "--idle"))]


def wait_py_spy(spies: list[subprocess.Popen], timeout: float) -> None:
    for proc in spies:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def phase(http, base: str, keys: dict, args: argparse.Namespace, pid: int, flood_bodies: list[bytes] | None,
                chat_body: bytes) -> dict:
    """The chat clients (and the flood, if `flood_bodies`) start together and run --settle seconds
    unmeasured (the clients fall out of step, the flood reaches its steady state), then --seconds
    measured: chat requests started in that window count, the daemon's CPU and /metrics are read at
    its ends. The chat clients stop themselves; the flood is stopped after them."""
    flood: list = []
    chats: list = []
    stop_flood = asyncio.Event()
    flood_tasks = []
    if flood_bodies is not None:
        flood_tasks = [asyncio.ensure_future(flood_client(http, base + "/v1/embeddings", keys["bulk"], body,
                                                          args.inputs, stop_flood, flood, args.honor_retry_after))
                       for body in flood_bodies]
    end = time.monotonic() + args.settle + args.seconds
    chat = asyncio.ensure_future(asyncio.wait_for(asyncio.gather(*(
        chat_client(http, base + "/v1/chat/completions", keys["chat"], chat_body, end, chats)
        for _ in range(args.chat_clients))), args.settle + args.seconds + 60))
    try:
        await asyncio.sleep(args.settle)
        m0 = await scrape(http, base, keys["metrics"])
        spy = start_py_spy(args.py_spy, pid, "flood" if flood_bodies is not None else "alone", args.seconds)
        cpu0, client0, t0 = cpu_seconds(pid), time.process_time(), time.monotonic()
        await chat
        t1 = time.monotonic()
        cpu1, client1 = cpu_seconds(pid), time.process_time()
        m1 = await scrape(http, base, keys["metrics"])
        await asyncio.to_thread(wait_py_spy, spy, args.seconds + 30)
    finally:
        chat.cancel()
        stop_flood.set()
        if flood_tasks:
            done, pending = await asyncio.wait(flood_tasks, timeout=60)
            for task in pending:
                task.cancel()
            await asyncio.gather(*flood_tasks, return_exceptions=True)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()
    wall = t1 - t0
    chats = [c for c in chats if c[0] >= t0]
    ok = [c for c in chats if c[3] == 200 and c[1] is not None]
    ttfts, e2es = sorted(c[1] for c in ok), sorted(c[2] for c in ok)
    statuses: dict = {}
    for c in chats:
        statuses[str(c[3])] = statuses.get(str(c[3]), 0) + 1
    out = {"seconds": round(wall, 2), "chat_requests": len(chats), "chat_statuses": statuses,
           "chat_without_content": sum(1 for c in chats if c[3] == 200 and c[1] is None),
           "chat_ttft_p50_ms": ms(quantile(ttfts, 0.5)), "chat_ttft_p99_ms": ms(quantile(ttfts, 0.99)),
           "chat_ttft_max_ms": ms(ttfts[-1] if ttfts else None),
           # the slowest first tokens: (seconds into the window the request started, TTFT ms)
           "chat_ttft_slowest": [(round(c[0] - t0, 2), ms(c[1])) for c in sorted(ok, key=lambda c: -c[1])[:5]],
           "chat_e2e_p50_ms": ms(quantile(e2es, 0.5)), "chat_e2e_p99_ms": ms(quantile(e2es, 0.99)),
           "daemon_cpu": round((cpu1 - cpu0) / wall, 3), "client_cpu": round((client1 - client0) / wall, 3),
           "daemon_metrics": metric_deltas(m0, m1)}
    if flood_bodies is not None:
        window = [f for f in flood if t0 <= f[0] <= t1]
        fstat: dict = {}
        for f in flood:
            fstat[str(f[2])] = fstat.get(str(f[2]), 0) + 1
        good = [f for f in window if f[2] == 200]
        lat = sorted(f[1] for f in good)
        batches = out["daemon_metrics"].get("embed", {}).get("embedding_batch_size", {})
        computed = batches.get("count", 0) * batches.get("mean", 0.0)
        out["flood"] = {
            "clients": len(flood_bodies), "inputs_per_request": args.inputs,
            "requests": len(flood), "statuses": fstat, "requests_in_window": len(window),
            "inputs_per_s": round(sum(f[3] for f in good) / wall, 1),
            # what the engine computed (batch sizes from /metrics): more than was delivered when inputs
            # of requests that were then refused (or whose client left) still ran
            "inputs_computed_per_s": round(computed / wall, 1),
            "tokens_per_input": round(sum(f[4] for f in good) / max(1, sum(f[3] for f in good)), 1),
            "request_p50_ms": ms(quantile(lat, 0.5)), "request_p99_ms": ms(quantile(lat, 0.99))}
    return out


async def run_bench(args: argparse.Namespace, port: int, keys: dict, pid: int) -> dict:
    import aiohttp

    base = f"http://127.0.0.1:{port}"
    chat_body = json.dumps({"model": "chat", "messages": CHAT_MESSAGES, "max_tokens": args.max_tokens,
                            "stream": True, "ignore_eos": True, "temperature": 0}).encode()
    texts = embedding_texts(args.flood_clients * args.inputs, args.input_tokens, seed=16)
    flood_bodies = [json.dumps({"model": "embed", "input": texts[i * args.inputs:(i + 1) * args.inputs],
                                "encoding_format": args.encoding}).encode() for i in range(args.flood_clients)]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as http:
        # Warm-up: first requests pay one-time costs (code paths, buffers, the batcher's compute line).
        end = time.monotonic() + args.warmup
        warm: list = []
        await asyncio.gather(*(chat_client(http, base + "/v1/chat/completions", keys["chat"], chat_body, end, warm)
                               for _ in range(args.chat_clients)))
        for body in flood_bodies[:2]:
            async with http.post(base + "/v1/embeddings", data=body,
                                 headers={"Authorization": f"Bearer {keys['bulk']}",
                                          "Content-Type": "application/json"}) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"warm-up embedding request: {resp.status}")
        if not warm or any(w[3] != 200 for w in warm):
            raise RuntimeError(f"warm-up chat requests failed: {warm[:3]}")
        results = {"alone": await phase(http, base, keys, args, pid, None, chat_body)}
        results["flood"] = await phase(http, base, keys, args, pid, flood_bodies, chat_body)
    a, f = results["alone"], results["flood"]
    results["ttft_p99_ratio"] = (round(f["chat_ttft_p99_ms"] / a["chat_ttft_p99_ms"], 3)
                                 if a["chat_ttft_p99_ms"] and f["chat_ttft_p99_ms"] else None)
    results["ttft_p50_ratio"] = (round(f["chat_ttft_p50_ms"] / a["chat_ttft_p50_ms"], 3)
                                 if a["chat_ttft_p50_ms"] and f["chat_ttft_p50_ms"] else None)
    return results


def verdict(results: dict) -> str:
    """One line from the measured numbers: the p99 TTFT ratio against RATIO_GOAL, whether chat was
    always answered, and whether the flood's engine work reached its clients."""
    a, f = results["alone"], results["flood"]
    fl = f["flood"]
    ratio = results["ttft_p99_ratio"]
    if ratio is None:
        return "verdict: no chat TTFT measured in one of the phases; nothing to compare"
    chat_ok = f["chat_requests"] > 0 and f["chat_statuses"].get("200", 0) == f["chat_requests"]
    useful = fl["inputs_per_s"] / fl["inputs_computed_per_s"] if fl["inputs_computed_per_s"] else 0.0
    if fl["inputs_per_s"] <= 0:
        embeddings = "embeddings STARVED (nothing delivered)"
    elif useful < 0.5:
        embeddings = (f"embeddings delivered only {fl['inputs_per_s']:.0f} inputs/s, {useful:.0%} of the "
                      f"{fl['inputs_computed_per_s']:.0f}/s the engine computed (the rest went to refused requests)")
    else:
        embeddings = f"embeddings delivered {fl['inputs_per_s']:.0f} inputs/s ({useful:.0%} of what was computed)"
    return (f"verdict: chat p99 TTFT under the embeddings flood is x{ratio:.2f} of alone "
            f"({a['chat_ttft_p99_ms']:.1f} -> {f['chat_ttft_p99_ms']:.1f} ms; p50 x{results['ttft_p50_ratio']}), "
            f"{'within' if ratio <= RATIO_GOAL else 'OVER'} the x{RATIO_GOAL} bound; chat "
            f"{'always answered' if chat_ok else 'had failures'}; {embeddings}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", default="bench", choices=("bench", "daemon"))
    parser.add_argument("--config", type=Path)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of chat before measuring")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds each phase's clients (and the flood) run before measuring")
    parser.add_argument("--chat-clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--flood-clients", type=int, default=16)
    parser.add_argument("--inputs", type=int, default=64, help="inputs per embeddings request")
    parser.add_argument("--input-tokens", type=int, default=100, help="about this many tokens per input")
    parser.add_argument("--ignore-retry-after", dest="honor_retry_after", action="store_false",
                        help="flood clients retry a 429/503 at once (default: after its Retry-After, as the "
                             "official SDKs do)")
    parser.add_argument("--bulk-max-queued", type=int, default=None,
                        help="tenant bulk's max_queued_requests (default: the config default)")
    parser.add_argument("--py-spy", type=Path, metavar="DIR",
                        help="record the daemon with py-spy during each measured phase into DIR (diagnosis)")
    parser.add_argument("--encoding", default="base64", choices=("base64", "float"),
                        help="encoding_format of the flood (the OpenAI SDK sends base64 by default)")
    args = parser.parse_args()
    started: dict = {}

    def start(work: Path) -> tuple[subprocess.Popen, dict]:
        proc, info = start_daemon(work, args.bulk_max_queued)
        started.update(info)
        return proc, info

    results = daemon_or_bench(args, "inferd-embflood-", start,
                              lambda info, pid: run_bench(args, info["port"], info["keys"], pid), CLIENT_CPU)
    if results is None:
        return
    results["check_config"] = started["check_config"]
    results["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                       if k not in ("role", "config")}
    print(json.dumps(results, indent=2))
    print(summary(results, args))


def _f(value: float | None, spec: str = "7.1f") -> str:
    return "-" if value is None else format(value, spec)


def summary(results: dict, args: argparse.Namespace) -> str:
    a, f = results["alone"], results["flood"]
    lines = [f"\ninferd from {results['inferd']}; {args.chat_clients} interactive chat streams "
             f"({args.max_tokens} tokens), ms:",
             "  phase   requests  TTFT p50 / p99      e2e p50 / p99    daemon CPU  client CPU   "
             "daemon's view: TTFT p99, queue wait p99, write delay p99"]
    for name, r in (("alone", a), ("flood", f)):
        chat = r["daemon_metrics"].get("chat", {})
        own = [chat.get(k, {}).get("p99_ms") for k in ("time_to_first_token", "queue_wait", "stream_write_delay")]
        lines.append(f"  {name:<7} {r['chat_requests']:8d}  {_f(r['chat_ttft_p50_ms'])} / {_f(r['chat_ttft_p99_ms'])}"
                     f"  {_f(r['chat_e2e_p50_ms'])} / {_f(r['chat_e2e_p99_ms'])}  {r['daemon_cpu']:9.0%}  "
                     f"{r['client_cpu']:9.0%}   {' / '.join(_f(v, '.1f') for v in own)}")
    fl = f["flood"]
    refusals = f["daemon_metrics"].get("tenant bulk", {}).get("rejections", {})
    lines += [f"  flood: {fl['clients']} clients x {fl['inputs_per_request']} inputs (~{fl['tokens_per_input']:.0f} "
              f"tokens each, {args.encoding}{', honoring Retry-After' if args.honor_retry_after else ''}): "
              f"{fl['inputs_per_s']:.0f} inputs/s delivered ({fl['inputs_computed_per_s']:.0f}/s computed), "
              f"{fl['requests']} requests {fl['statuses']}, a 200 took p50 {_f(fl['request_p50_ms'], '.0f')} ms; "
              f"admission refusals of bulk's inputs {refusals}",
              f"  chat p99 TTFT ratio flood/alone x{results['ttft_p99_ratio']}  (p50 x{results['ttft_p50_ratio']})",
              verdict(results)]
    return "\n".join(lines)

if __name__ == "__main__":
    main()
