"""bench/gpu_check.py's direct phases: the memory bandwidth, and the torch engine driven in process.

- `copy_bandwidth`: bytes read + written per second by a copy of one large buffer into another (a
  device-to-device copy on CUDA, timed with events; a host memcpy on the CPU): the roofline's bandwidth.
- `run_workload`: requests of fixed prompt token ids through an engine, `concurrency` in flight, greedy with
  `ignore_eos`; every token's arrival time per request, and every engine step (its end and its wall time,
  from the engine's step_observer).
- `throughput`: for each batch size B, B requests at once: output tokens/s over the whole run, and the
  decode step time in the window where all B decode (after the last first token, before the first finish)
  against the roofline (weight bytes + KV bytes a step reads) / bandwidth. Then the streams workload the
  daemon phase repeats over HTTP, so the two compare like for like.
"""
from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemon_metrics import percentile
from gpu_models import Shape, dummy_artifact


@dataclass
class Tally:
    started: float = field(default_factory=time.monotonic)
    ended: float = 0.0
    arrivals: list[list[float]] = field(default_factory=list)     # per request: each token's arrival
    steps: list[tuple[float, float]] = field(default_factory=list)  # (end, wall seconds) per engine step

    @property
    def tokens(self) -> int:
        return sum(len(a) for a in self.arrivals)

    def tokens_per_s(self) -> float:
        return self.tokens / max(1e-9, self.ended - self.started)

    def itl_ms(self) -> list[float]:
        gaps = [(b - a) * 1000 for times in self.arrivals for a, b in itertools.pairwise(times)]
        return sorted(gaps)

    def decode_steps(self) -> list[float]:
        """Wall seconds of the steps where every request was decoding."""
        first = max(times[0] for times in self.arrivals if times)
        last = min(times[-1] for times in self.arrivals if times)
        inside = [wall for end, wall in self.steps if first < end <= last]
        return inside or [wall for _, wall in self.steps]


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Distinct random prompts of ordinary tokens (below Llama 3's specials): no prefix-cache hits."""
    rng = random.Random(seed)
    top = vocab - 257
    return [[rng.randrange(1, top) for _ in range(length)] for _ in range(count)]


async def run_workload(engine, prompt_ids: list[list[int]], output_len: int, concurrency: int, tag: str) -> Tally:
    from inferd.types import GenerationRequest, SamplingParams

    sampling = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    tally, gate = Tally(), asyncio.Semaphore(concurrency)
    engine.step_observer = lambda wall: tally.steps.append((time.monotonic(), wall))

    async def one(i: int, ids: list[int]) -> None:
        async with gate:
            times: list[float] = []
            tally.arrivals.append(times)
            stream = engine.submit(GenerationRequest(request_id=f"{tag}-{i}-{time.monotonic_ns()}",
                                                     prompt_token_ids=tuple(ids), sampling=sampling))
            async for delta in stream:
                now = time.monotonic()
                times.extend([now] * len(delta.token_ids))
                if delta.error:
                    raise RuntimeError(f"request {i} failed: {delta.error}")

    try:
        await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompt_ids)))
    finally:
        engine.step_observer = None
    tally.ended = time.monotonic()
    return tally


def copy_bandwidth(device: str, nbytes: int, repeats: int = 10) -> float:
    """Bytes moved (read + written) per second by `src -> dst` copies, the median of `repeats`."""
    import torch

    src = torch.arange(nbytes // 4, dtype=torch.int32, device=device)   # not zeros: what a real read sees
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 2):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t0
        if i >= 2:                                   # two warm-ups: pages touched, clocks up
            times.append(seconds)
    if int(dst[-1]) != int(src[-1]):
        raise RuntimeError("the bandwidth copy did not copy")
    moved = 2 * src.numel() * 4
    del src, dst
    if device.startswith("cuda"):
        torch.cuda.empty_cache()            # the engine's pool is sized from the memory left
    return moved / statistics.median(times)


def make_engine(args, artifact: Path, max_batch: int, max_model_len: int):
    from inferd.engine.torch.engine import TorchEngine

    cuda = args.device.startswith("cuda")
    blocks = None if cuda else max_batch * -(-max_model_len // 16) + 64
    return TorchEngine(artifact, num_kv_blocks=blocks, device=args.device, dtype=args.dtype,
                       gpu_memory_utilization=args.gpu_memory_utilization,
                       cuda_graphs=cuda and not args.enforce_eager,
                       cuda_graph_max_batch_size=max_batch if cuda else None, load_format="dummy",
                       max_batch_size=max_batch, max_num_tokens=args.max_num_tokens, max_model_len=max_model_len)


def dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def batch_result(shape: Shape, dtype: str, batch: int, args, tally: Tally, bandwidth: float) -> dict:
    steps = sorted(tally.decode_steps())
    step_s = statistics.median(steps)
    size = dtype_bytes(dtype)
    context = args.prompt_len + args.output_len / 2              # the mean context over the decode window
    read = shape.decode_weight_bytes(size, batch) + batch * context * shape.kv_bytes_per_token(size)
    roofline_s = read / bandwidth
    seconds = tally.ended - tally.started
    return {"batch": batch, "tokens_per_s": round(tally.tokens_per_s(), 1), "seconds": round(seconds, 2),
            "decode_step_ms": round(step_s * 1000, 3), "decode_steps": len(steps),
            "decode_tokens_per_s": round(batch / step_s, 1), "roofline_step_ms": round(roofline_s * 1000, 3),
            "roofline_share": round(roofline_s / step_s, 3), "bytes_per_step": int(read)}


async def throughput(args, shape: Shape, work: Path) -> dict:
    """The bandwidth, each batch size's run and the streams workload, in one engine."""
    bandwidth = copy_bandwidth(args.device, args.bandwidth_mib << 20)
    artifact = dummy_artifact(work / "engines", args.artifact_name, shape)
    batches = args.batches
    streams = args.streams
    max_batch = max([*batches, streams])
    loaded = time.monotonic()
    engine = make_engine(args, artifact, max_batch, args.prompt_len + args.output_len + 16)
    await engine.start()
    try:
        await engine.warmup()
        load_s = time.monotonic() - loaded
        await run_workload(engine, prompts(min(4, max_batch), args.prompt_len, shape.vocab, 99), 8, 4, "warm")
        result = {"bandwidth_gb_s": round(bandwidth / 1e9, 1), "load_s": round(load_s, 1),
                  "kv_blocks": engine.info.num_kv_blocks, "hardware": engine.hardware,
                  "weight_bytes": engine.model.weight_bytes(), "batches": []}
        for i, batch in enumerate(batches):
            tally = await run_workload(engine, prompts(batch, args.prompt_len, shape.vocab, 1000 + i),
                                       args.output_len, batch, f"b{batch}")
            result["batches"].append(batch_result(shape, args.dtype, batch, args, tally, bandwidth))
        tally = await run_workload(engine, prompts(args.requests, args.prompt_len, shape.vocab, args.seed),
                                   args.output_len, streams, "streams")
        itl = tally.itl_ms()
        result["streams"] = {"streams": streams, "requests": args.requests, "tokens": tally.tokens,
                             "tokens_per_s": round(tally.tokens_per_s(), 1),
                             "itl_p50_ms": round(percentile(itl, 0.5), 3),
                             "itl_p99_ms": round(percentile(itl, 0.99), 3)}
        return result
    finally:
        await engine.close()
