"""bench/gpu_check.py's daemon phase: the streams workload of the direct phase through `inferd serve`.

The daemon (the real Daemon in a subprocess, as `inferd serve` runs it: bench/daemon_process.py) serves one
torch model with the direct phase's engine settings. The client streams the same requests (same prompt
token ids, output length, streams in flight) over HTTP/SSE on 127.0.0.1 with a raw asyncio protocol (a
client library's per-chunk parsing would set the pace at 256 streams), counting tokens from each chunk's
running usage. It reports tokens/s (gpu_check divides by the direct figure), the latency the front adds to
a token (inferd_stream_write_delay_seconds p99, as bench/node.py), the client's ITL, and what a client
disconnect frees: one stream is dropped mid-generation and /metrics is polled until its KV blocks are free
(inferd_kv_cache_blocks{state="used"}), counting the engine steps (inferd_engine_steps_total) in between.
"""
from __future__ import annotations

import asyncio
import itertools
import re
import sys
import time
from pathlib import Path

from daemon_metrics import delay_buckets, histogram_quantile, metrics_text, percentile
from daemon_process import spawn, stop
from gpu_direct import prompts
from gpu_models import Shape, dummy_artifact
from process_cpu import descendants, role_of
from sse_load import Refused, SseClient, http_post, reuse

MODEL = "bench"
CONFIG = """
[server]
host = "127.0.0.1"
port = 0
log_level = "warning"
engines_root = "{engines}"
front_processes = {front_processes}
max_connections = {connections}

[tenants.local]
max_concurrent_requests = {connections}

[admission]
max_engine_waiting = {max_batch}
early_refusal = {early_refusal}

[models.bench]
backend = "torch"
artifact = "{artifact}"
max_batch_size = {max_batch}
max_num_tokens = {max_num_tokens}
max_model_len = {max_model_len}
{blocks}
[models.bench.torch]
device = "{device}"
dtype = "{dtype}"
load_format = "dummy"
gpu_memory_utilization = {utilization}
{graphs}
"""
_USED = re.compile(r'^inferd_kv_cache_blocks\{[^}]*state="used"[^}]*\} ([0-9.e+]+)$', re.MULTILINE)
_GENERATED = re.compile(r'^inferd_engine_generated_tokens_total\{[^}]*\} ([0-9.e+]+)$', re.MULTILINE)
_STEP_SUM = re.compile(r'^inferd_engine_step_seconds_sum\{[^}]*\} ([0-9.e+]+)$', re.MULTILINE)
_STEP_COUNT = re.compile(r'^inferd_engine_step_seconds_count\{[^}]*\} ([0-9.e+]+)$', re.MULTILINE)
_TOKENS = re.compile(rb'"completion_tokens":(\d+)')


def config_text(args, engines: Path, max_batch: int, max_model_len: int, front_processes: str = "0") -> str:
    cuda = args.device.startswith("cuda")
    blocks = "" if cuda else f"num_kv_blocks = {max_batch * -(-max_model_len // 16) + 64}\n"
    graphs = "cuda_graphs = false" if args.enforce_eager else (
        f"cuda_graph_max_batch_size = {max_batch}" if cuda else "")
    return CONFIG.format(engines=engines, connections=args.streams + 16, max_batch=max_batch,
                         artifact=args.artifact_name, max_num_tokens=args.max_num_tokens,
                         max_model_len=max_model_len, blocks=blocks, device=args.device, dtype=args.dtype,
                         utilization=args.gpu_memory_utilization, graphs=graphs,
                         early_refusal=str(not args.no_early_refusal).lower(),
                         front_processes=front_processes if front_processes.isdigit() else f'"{front_processes}"')


def _value(pattern: re.Pattern, text: str) -> float:
    return sum(float(v) for v in pattern.findall(text))


class _Stream(SseClient):
    """Each arrival's time and the tokens it brought (from the running usage)."""

    def __init__(self, arrivals: list[tuple[float, int]]) -> None:
        super().__init__()
        self.arrivals, self.tokens = arrivals, 0

    def start(self, request: bytes) -> asyncio.Future:
        self.tokens = 0
        return super().start(request)

    def data_received(self, data: bytes) -> None:
        found = _TOKENS.findall(self.tail[-40:] + data)
        if found and int(found[-1]) > self.tokens:
            count = int(found[-1])
            self.arrivals.append((time.monotonic(), count - self.tokens))
            self.tokens = count
        self._received(data)


def _request(port: int, ids: list[int], max_tokens: int) -> bytes:
    return http_post(port, {"model": MODEL, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                            "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True, "continuous_usage_stats": True}})


async def streams_workload(port: int, prompt_ids: list[list[int]], output_len: int, concurrency: int) -> dict:
    loop = asyncio.get_running_loop()
    queue = list(enumerate(prompt_ids))[::-1]
    per_request: list[list[tuple[float, int]]] = []
    trouble = {"refused": 0, "cut": 0, "first_refusal": "", "first_cut": ""}
    started = time.monotonic()

    async def worker() -> None:
        _, proto = await loop.create_connection(lambda: _Stream([]), "127.0.0.1", port)
        try:
            while queue:
                item = queue.pop()
                proto = await reuse(proto, lambda: _Stream([]), port)
                proto.arrivals = []
                try:
                    await proto.start(_request(port, item[1], output_len))
                except Refused as refusal:     # as a client honouring Retry-After would: wait, then again
                    trouble["refused"] += 1
                    trouble["first_refusal"] = trouble["first_refusal"] or str(refusal)
                    if trouble["refused"] > 20 * len(prompt_ids):
                        raise
                    queue.append(item)
                    await asyncio.sleep(refusal.wait_s)
                    continue
                except ConnectionError as cut:     # a stream the server ended early: counted, not retried
                    trouble["cut"] += 1
                    trouble["first_cut"] = trouble["first_cut"] or str(cut)[:400]
                    proto.transport.close()
                per_request.append(proto.arrivals)
        finally:
            proto.transport.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    ended = time.monotonic()
    tokens = sum(k for arrivals in per_request for _, k in arrivals)
    itl: list[float] = []
    for arrivals in per_request:
        for (a, _), (b, k) in itertools.pairwise(arrivals):
            itl.extend([(b - a) * 1000 / k] * k)
    itl.sort()
    return {**trouble, "tokens": tokens, "tokens_per_s": round(tokens / (ended - started), 1),
            "client_itl_p50_ms": round(percentile(itl, 0.5), 3), "client_itl_p99_ms": round(percentile(itl, 0.99), 3)}


async def disconnect_check(port: int, ids: list[int], max_tokens: int, deadline_s: float = 30.0) -> dict:
    """Drop one stream (alone on the engine) mid-generation. Until /metrics shows its KV blocks free: how
    long, and how many tokens the engine generated past the last one the client had received when it went
    (inferd_engine_generated_tokens_total; one token per step of a lone stream, the one in flight included).
    Also the mean step time while it ran, the unit of the goal."""
    loop = asyncio.get_running_loop()
    text = await asyncio.to_thread(metrics_text, port)
    baseline, generated = _value(_USED, text), _value(_GENERATED, text)
    step_sum, step_count = _value(_STEP_SUM, text), _value(_STEP_COUNT, text)
    arrivals: list[tuple[float, int]] = []
    _, proto = await loop.create_connection(lambda: _Stream(arrivals), "127.0.0.1", port)
    done = proto.start(_request(port, ids, max_tokens))
    done.add_done_callback(lambda f: f.exception())     # the drop below ends it with ConnectionError
    limit = time.monotonic() + deadline_s
    while proto.tokens < 8:
        if time.monotonic() > limit:
            raise TimeoutError("the disconnect check's stream produced no tokens")
        await asyncio.sleep(0.005)
    text = await asyncio.to_thread(metrics_text, port)
    held = _value(_USED, text) - baseline
    step_s = (_value(_STEP_SUM, text) - step_sum) / max(1.0, _value(_STEP_COUNT, text) - step_count)
    received, dropped = proto.tokens, time.monotonic()
    proto.transport.abort()                               # the client goes away (RST, as a killed client)
    while True:
        text = await asyncio.to_thread(metrics_text, port)
        if _value(_USED, text) <= baseline:
            break
        if time.monotonic() > limit:
            raise TimeoutError(f"KV blocks of a dropped stream still held after {deadline_s:.0f} s")
    freed_ms = (time.monotonic() - dropped) * 1000
    past = _value(_GENERATED, text) - generated - received
    return {"blocks_held": int(held), "freed_ms": round(freed_ms, 2), "tokens_after_disconnect": int(past),
            "step_ms": round(step_s * 1000, 3)}


async def daemon_phase(args, shape: Shape, work: Path, front_processes: str = "0") -> dict:
    """The streams workload and the disconnect check through `inferd serve` with `front_processes` SSE
    writer processes (0: every stream written in the daemon)."""
    dummy_artifact(work / "engines", args.artifact_name, shape)
    max_batch = max([*args.batches, args.streams])
    max_model_len = args.prompt_len + args.output_len + 16
    config = work / f"daemon-{front_processes}.toml"
    config.write_text(config_text(args, work / "engines", max_batch, max_model_len, front_processes))
    log = "inferd-serve.log" if front_processes == "0" else "inferd-serve-writers.log"
    loaded = time.monotonic()
    proc, started = await asyncio.to_thread(spawn, [str(Path(__file__).parent / "gpu_check.py"), "--role", "daemon",
                                                    "--config", str(config)], work, log)
    port = started["port"]
    try:
        writers = sum(1 for pid in descendants(proc.pid)[1:] if role_of(pid, is_root=False) == "writer")
        load_s = time.monotonic() - loaded
        before = delay_buckets(await asyncio.to_thread(metrics_text, port))
        ids = prompts(args.requests, args.prompt_len, shape.vocab, args.seed)
        result = await streams_workload(port, ids, args.output_len, args.streams)
        after = delay_buckets(await asyncio.to_thread(metrics_text, port))
        delay = {b: after[b] - before.get(b, 0.0) for b in after}
        result.update({"load_s": round(load_s, 1), "streams": args.streams, "requests": args.requests,
                       "front_processes": front_processes, "writers": writers,
                       "added_itl_p50_ms": round(histogram_quantile(0.5, delay) * 1000, 3),
                       "added_itl_p99_ms": round(histogram_quantile(0.99, delay) * 1000, 3)})
        victim = prompts(1, args.prompt_len, shape.vocab, args.seed + 1)[0]
        result["disconnect"] = await disconnect_check(port, victim, max_model_len - args.prompt_len - 1)
        return result
    except BaseException:
        print(f"inferd serve log tail: {(work / log).read_text()[-2000:]}", file=sys.stderr)
        raise
    finally:
        await asyncio.to_thread(stop, proc)
