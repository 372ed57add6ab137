"""Measure an engine's throughput curves in-process and write them as `inferd capacity --curves` JSON.

    .venv/bin/python bench/capacity_curves.py --backend sim --profile llama3-8b-h100 --out curves.json
    .venv/bin/python bench/capacity_curves.py --backend reference --out reference.json
    inferd capacity --curves curves.json --rate 50 --prompt-mean 1500 --output-mean 300

Each engine runs for real, through the Engine interface as the daemon drives it: GenerationRequests
are submitted, their RequestStreams collected, and each step's duration is read from the engine's
`step_observer` (the hook that feeds inferd_engine_step_seconds). For the sim that is simulated time
(what the modelled GPU takes: equal to the engine's `sim_time` delta per step), for the reference
engine the step thread's wall time on this CPU.

Two measurements per engine (schema and meaning of the fields: docs/capacity.md):

- prefill_tokens_per_s: enough distinct prompts of --prompt-len tokens, each asking for one token, are
  submitted at once, so every step's --max-num-tokens budget is full of prefill (prompts share a step
  and are chunked to fill it). The rate is the budget over the median full step (pooled over
  --repeats runs); each run's last, partial step is left out.
- decode: for each batch b in 1, 2, 4, ... --max-batch, b requests of prompt --context - (steps-1)/2
  and --decode-steps + 1 output tokens. The decode engine's budget holds every prompt of the batch,
  so step 1 prefills all of them and each later step decodes the whole batch, at contexts centred on
  --context; the step time is the median of those steps (pooled over --repeats runs). A run with any
  other step count (a preemption, a budget the engine did not fill) is refused rather than misread.

Distinct random prompts under distinct tenants keep the prefix cache out of it. Everything is bounded:
a fixed number of requests per measurement, and --max-seconds per curve (batches not reached by then
are left out, and said so on stderr). No network.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from inferd.engine.base import Engine, EngineError, blocks_for
from inferd.types import FinishReason, GenerationRequest, SamplingParams

# make_engine(max_num_tokens, max_batch_size, kv_tokens) -> an engine not yet started. kv_tokens is
# what the measurement needs the KV pool to hold; engines with a pool of their own (the sim) ignore it.
EngineFactory = Callable[[int, int, int], Engine]


class MeasureError(Exception):
    """The engine did not behave as the measurement needs (or ran out of time before any figure)."""


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... below max_batch, then max_batch itself."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


class _Run:
    """One engine, started and warmed (its warmup steps untimed), and the step durations of each load on it."""

    def __init__(self, engine: Engine, tag: str, deadline: float) -> None:
        self.engine, self.tag, self.deadline = engine, tag, deadline
        self.steps: list[float] = []
        self._rng = random.Random(tag)
        self._count = 0

    async def __aenter__(self) -> _Run:
        await self.engine.start()
        try:
            await asyncio.wait_for(self.engine.warmup(), max(0.0, self.remaining()))
        except BaseException as exc:
            await self.engine.close()
            if isinstance(exc, TimeoutError):
                raise MeasureError(f"the {self.tag} engine did not start and warm up within --max-seconds") from None
            raise
        # After warmup: its steps are not part of any measurement. list.append is atomic, so the
        # reference engine's step thread may call this.
        self.engine.step_observer = self.steps.append
        return self

    async def __aexit__(self, *exc) -> None:
        self.engine.step_observer = None
        await self.engine.close()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    async def load(self, count: int, prompt_len: int, max_tokens: int) -> list[float]:
        """Submit `count` requests at once and wait for all of them; the step durations they took."""
        vocab = self.engine.tokenizer.vocab_size
        low = min(300, vocab // 4)       # clear of special and byte tokens, as the tests' prompts are
        self.steps.clear()
        streams = []
        for _ in range(count):
            self._count += 1
            rid = f"capacity-{self.tag}-{self._count}"
            prompt = tuple(self._rng.randrange(low, vocab) for _ in range(prompt_len))
            streams.append(self.engine.submit(GenerationRequest(
                request_id=rid, tenant=rid, prompt_token_ids=prompt,
                sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))))
        try:
            finals = await asyncio.wait_for(asyncio.gather(*(s.collect() for s in streams)),
                                            max(0.0, self.remaining()))
        except TimeoutError:
            for s in streams:
                self.engine.abort(s.request_id)
            raise
        for final in finals:
            if final.finish_reason is not FinishReason.LENGTH or final.usage.completion_tokens != max_tokens:
                raise MeasureError(f"a request ended with {final.finish_reason} after "
                                   f"{final.usage.completion_tokens} of {max_tokens} tokens: {final.error or ''}")
        return list(self.steps)


async def measure_curve(make_engine: EngineFactory, *, name: str, gpus_per_replica: int, prompt_len: int,
                        context: int, max_batch: int, max_num_tokens: int, decode_steps: int = 9,
                        prefill_steps: int = 8, repeats: int = 1, max_seconds: float = 60.0, description: str = "",
                        kv_sequence_tokens: int | None = None,
                        log: Callable[[str], None] = lambda line: None) -> dict:
    """One profile's curve, as the curves file holds it under profiles.<name>.

    max_batch is the largest batch measured or, with kv_sequence_tokens, the sequences of that many tokens
    the decode engine's KV pool holds, if fewer (the planner's KV limit for a p95 prompt + p95 output)."""
    if min(prompt_len, context, max_batch, max_num_tokens, decode_steps, prefill_steps, repeats) < 1:
        raise MeasureError("prompt length, context, max batch, budget, step counts and repeats must all be >= 1")
    deadline = time.monotonic() + max_seconds
    budget = max_num_tokens

    # -- prefill: every step's budget full of prompts ------------------------------------------------
    count = math.ceil((prefill_steps + 1) * budget / prompt_len)
    in_flight = budget // prompt_len + 2          # prompts one step can touch; slots must not limit them
    kv_tokens = in_flight * blocks_for(prompt_len + 1, 16) * 16
    total = count * prompt_len                    # at least prefill_steps + 1 budgets' worth
    expected = math.ceil(total / budget)
    full: list[float] = []                        # every step but each run's last (partial) one
    async with _Run(make_engine(budget, max(max_batch, in_flight), kv_tokens), "prefill", deadline) as run:
        for attempt in range(repeats + 1):
            try:
                steps = await run.load(count, prompt_len, 1)
            except TimeoutError:
                if full:
                    break
                raise MeasureError(f"the prefill measurement did not finish within --max-seconds "
                                   f"{max_seconds:g}") from None
            if len(steps) != expected:
                raise MeasureError(f"{total} prompt tokens took {len(steps)} steps, not {expected}: the engine did "
                                   f"not fill its {budget}-token budget (slots or KV too small?)")
            if attempt:                   # the first run warms these shapes (caches, BLAS threads): untimed
                full += steps[:-1]
    # The median full step: steps the host descheduled (the reference engine's wall time) do not count.
    full_step = statistics.median(full)
    prefill_rate = budget / full_step
    log(f"{name}: prefill {prefill_rate:,.0f} prompt tokens/s ({count} prompts of {prompt_len} tokens, "
        f"{len(full)} full steps of a {budget}-token budget, median {full_step * 1e3:.2f} ms)")

    # -- decode: one prefill step, then decode steps of the whole batch ------------------------------
    prompt = max(1, context - (decode_steps - 1) // 2)
    per_seq = blocks_for(prompt + decode_steps + 1, 16) * 16
    points: list[dict] = []
    async with _Run(make_engine(max(budget, max_batch * prompt), max_batch, max_batch * per_seq), "decode",
                    deadline) as run:
        info = run.engine.info
        kv_batch = info.num_kv_blocks // blocks_for(prompt + decode_steps + 1, info.block_size)
        sizes = batch_sizes(max_batch)
        if kv_batch < max_batch:
            log(f"{name}: the KV pool ({info.num_kv_blocks} blocks of {info.block_size}) holds {kv_batch} sequences "
                f"at this context, not {max_batch}: measuring up to {kv_batch}")
            sizes = [b for b in sizes if b < kv_batch] + [kv_batch]
        kv_limit = None
        if kv_sequence_tokens is not None:
            kv_limit = info.num_kv_blocks // blocks_for(kv_sequence_tokens, info.block_size)
            if kv_limit < 1:
                raise MeasureError(f"one sequence of {kv_sequence_tokens} tokens does not fit the KV pool "
                                   f"({info.num_kv_blocks} blocks of {info.block_size})")
            log(f"{name}: the KV pool ({info.num_kv_blocks} blocks of {info.block_size}) holds {kv_limit} "
                f"sequences of {kv_sequence_tokens} tokens")
        for b in sizes:
            if run.remaining() <= 0:
                log(f"{name}: --max-seconds {max_seconds:g} reached: batches from {b} on not measured")
                break
            decode: list[float] = []
            try:
                for _ in range(repeats):
                    steps = await run.load(b, prompt, decode_steps + 1)
                    if len(steps) != decode_steps + 1:
                        raise MeasureError(f"batch {b} took {len(steps)} steps, not 1 prefill + {decode_steps} "
                                           "decode: the engine did not run the batch in lockstep (preemption?)")
                    decode += steps[1:]
            except TimeoutError:
                log(f"{name}: --max-seconds {max_seconds:g} reached during batch {b}: not measured")
                break
            step_s = statistics.median(decode)
            points.append({"batch": b, "step_s": float(f"{step_s:.6g}")})
            log(f"{name}: batch {b:4d}: decode step {step_s * 1e3:8.3f} ms, {b / step_s:10,.0f} tokens/s")
    if not points:
        raise MeasureError(f"no decode batch measured within --max-seconds {max_seconds:g}")
    max_batch_held = points[-1]["batch"] if kv_limit is None else min(kv_limit, points[-1]["batch"])
    return {"gpus_per_replica": gpus_per_replica, "prefill_tokens_per_s": float(f"{prefill_rate:.6g}"),
            "decode": points, "max_batch": max_batch_held,
            "description": f"bench/capacity_curves.py {datetime.date.today().isoformat()}, "
                           f"{description or name}: prefill at {prompt_len}-token prompts with a {budget}-token "
                           f"budget, decode at context {context}"}


# -- backends -----------------------------------------------------------------------------------------

async def measure_sim(profile: str, *, name: str | None = None, **kwargs) -> dict:
    """A sim profile, in simulated seconds (time_scale 0: no sleeping; the steps' simulated time is read)."""
    from inferd.engine.sim import SimEngine
    from inferd.engine.sim.profiles import get_profile

    spec = get_profile(profile)
    longest = max(kwargs["prompt_len"], kwargs["context"]) + kwargs.get("decode_steps", 9) + 2

    def make(max_num_tokens: int, max_batch_size: int, kv_tokens: int) -> Engine:
        # The profile's own KV pool (as the daemon sizes it), not kv_tokens: its limit is part of the curve.
        return SimEngine(spec, time_scale=0.0, max_num_tokens=max_num_tokens, max_batch_size=max_batch_size,
                         max_model_len=max(8192, longest))

    return await measure_curve(make, name=name or spec.name,
                               gpus_per_replica=spec.tensor_parallel,
                               description=f"sim profile {spec.name}, simulated time", **kwargs)


async def measure_reference(artifact: Path, *, name: str | None = None, num_kv_blocks: int | None = None,
                            **kwargs) -> dict:
    """The NumPy reference engine on `artifact`, in wall time on this CPU (one replica = one process).

    Its KV pool holds what the measurement needs, or num_kv_blocks (the daemon's setting) if larger."""
    from inferd.engine.reference import ReferenceEngine

    def make(max_num_tokens: int, max_batch_size: int, kv_tokens: int) -> Engine:
        blocks = max(blocks_for(kv_tokens, 16) + 4, num_kv_blocks or 0)
        return ReferenceEngine(artifact, num_kv_blocks=blocks, block_size=16,
                               max_batch_size=max_batch_size, max_num_tokens=max_num_tokens)

    return await measure_curve(make, name=name or "reference-cpu", gpus_per_replica=1,
                               description=f"reference engine on {artifact.parent.name}@{artifact.name}, CPU wall time",
                               **kwargs)


# -- command line -----------------------------------------------------------------------------------

DEFAULTS = {   # per backend: the sim at the docs' worked example, the reference engine tiny and quick
    "sim": dict(prompt_len=1500, context=1650, max_batch=256, max_num_tokens=8192, repeats=1, max_seconds=60.0),
    "reference": dict(prompt_len=64, context=96, max_batch=8, max_num_tokens=256, repeats=3, max_seconds=60.0),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Schema of the output and how the planner reads it: docs/capacity.md")
    p.add_argument("--backend", choices=("sim", "reference"), required=True)
    p.add_argument("--profile", action="append", metavar="NAME",
                   help="sim: the profile to measure (repeatable; one curve each)")
    p.add_argument("--artifact", type=Path, metavar="DIR",
                   help="reference: an artifact directory (engines/<name>/<version>); default: build the "
                        "synthetic 'tiny' model in a temporary directory")
    p.add_argument("--name", help="the curve's name in the file (default: the sim profile, or 'reference-cpu')")
    p.add_argument("--prompt-len", type=int, metavar="TOKENS",
                   help="prompt length of the prefill measurement: the demand's mean prompt "
                        "(default: sim 1500, reference 64)")
    p.add_argument("--context", type=int, metavar="TOKENS",
                   help="context the decode steps run at: the demand's mean prompt + mean output / 2 "
                        "(default: sim 1650, reference 96)")
    p.add_argument("--max-batch", type=int, metavar="N",
                   help="largest decode batch measured, recorded as max_batch (default: sim 256, reference 8)")
    p.add_argument("--max-num-tokens", type=int, metavar="N",
                   help="the engine's token budget per step for prefill (default: sim 8192, reference 256)")
    p.add_argument("--decode-steps", type=int, default=9, metavar="N",
                   help="decode steps timed per batch; the median is kept (default 9)")
    p.add_argument("--repeats", type=int, metavar="N",
                   help="runs of the prefill load and of each decode batch, their steps pooled for the medians "
                        "(default: sim 1, as its time is exact; reference 3, against a shared CPU's noise)")
    p.add_argument("--prefill-steps", type=int, default=8, metavar="N",
                   help="full prefill steps timed (default 8)")
    p.add_argument("--kv-sequence-tokens", type=int, metavar="TOKENS",
                   help="record max_batch as the sequences of this many tokens the KV pool holds, if fewer than "
                        "--max-batch: the demand's p95 prompt + p95 output (the roofline's KV limit)")
    p.add_argument("--num-kv-blocks", type=int, metavar="N",
                   help="reference: the KV pool in 16-token blocks, as the daemon's config sets it (default: "
                        "what the measurement needs; the sim uses its profile's pool)")
    p.add_argument("--max-seconds", type=float, metavar="S",
                   help="bound on each curve's measuring time (default 60)")
    p.add_argument("--out", type=Path, metavar="FILE", help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    for key, value in DEFAULTS[args.backend].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.backend == "sim":
        args.profile = args.profile or ["llama3-8b-h100"]
        if args.artifact:
            p.error("--artifact is for --backend reference")
        if args.num_kv_blocks is not None:
            p.error("--num-kv-blocks is for --backend reference (the sim uses its profile's pool)")
    elif args.profile:
        p.error("--profile is for --backend sim")
    if args.name and len(args.profile or [None]) > 1:
        p.error("--name names one curve: give a single --profile")
    return args


async def run(args: argparse.Namespace) -> dict:
    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    common = dict(prompt_len=args.prompt_len, context=args.context, max_batch=args.max_batch,
                  max_num_tokens=args.max_num_tokens, decode_steps=args.decode_steps,
                  prefill_steps=args.prefill_steps, repeats=args.repeats, max_seconds=args.max_seconds, name=args.name,
                  kv_sequence_tokens=args.kv_sequence_tokens, log=log)
    profiles: dict[str, dict] = {}
    if args.backend == "sim":
        from inferd.engine.sim.profiles import get_profile
        for profile in args.profile:
            profiles[args.name or get_profile(profile).name] = await measure_sim(profile, **common)
        return {"profiles": profiles}
    if args.artifact is not None:
        profiles[args.name or "reference-cpu"] = await measure_reference(
            args.artifact, num_kv_blocks=args.num_kv_blocks, **common)
        return {"profiles": profiles}
    from inferd.artifacts.build.reference import build_synthetic
    with tempfile.TemporaryDirectory(prefix="capacity-curves-") as tmp:
        artifact = build_synthetic("tiny", Path(tmp), progress=lambda message: None)
        profiles[args.name or "reference-cpu"] = await measure_reference(
            artifact, num_kv_blocks=args.num_kv_blocks, **common)
    return {"profiles": profiles}


def format_curves(curves: dict) -> str:
    """The curves as indented JSON, one decode point a line."""
    text = json.dumps(curves, indent=2)
    return re.sub(r'\{\s*"batch": (\d+),\s*"step_s": ([^\s]+)\s*\}', r'{"batch": \1, "step_s": \2}', text) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        curves = asyncio.run(run(args))
    except (MeasureError, EngineError, ValueError) as exc:   # EngineError: e.g. a context beyond the model's
        print(f"capacity_curves: {exc}", file=sys.stderr)
        return 2
    text = format_curves(curves)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
