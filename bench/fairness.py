"""Fairness benchmark: the admission queue + the sim engine, in process, open-loop Poisson arrivals.

Each scenario runs twice in the same process, under our admission (default AdmissionConfig: weighted
VTC, classes, light tenants first, headroom, early refusal) and under plain FCFS (one FIFO behind the
same capacity gate, including the pending-prefill budget; no headroom, no early refusal, no class
TTLs), on the same engine settings, and prints the same figures for both:

  weights   two saturating tenants, weights 3:1 -> service share by cost (prompt + 2 x output)
  noisy     a tenant at 0.2x capacity beside one flooding at 5x -> its p99 TTFT vs. when alone
  ramp      load from 0.5x to 3x capacity -> goodput (TTFT and per-token SLO) vs. its peak, and how
            fast rejections come (wall milliseconds from admit() to the exception)
  hog       beta fills every sequence slot with long streams (ignore_eos, 7,000 tokens), then alpha sends
            requests -> alpha's p99 TTFT vs. alone. Ours only (FCFS has nothing to compare): preempting
            (the sim yields a slot: inferd.admission.slots), with fairness_preemption off (as before
            slots were fair), and on an engine that cannot preempt (as trtllm: the standing reserve);
            and a KV hog: beta's streams hold half the slots but, from 1,192-token prompts, all the KV

Times are simulated seconds: the sim engine runs at --time-scale (default 0.2: a 60 s scenario takes
12 s of wall time) and admission's clock is the loop clock divided by it; rejection latency is wall
time. Capacity (requests/s at saturation) is measured first with a time_scale = 0 calibration run.
Bounded: every scenario stops `--grace` simulated seconds after its last arrival, cancelling what is
left (an unfinished request counts as missing every SLO).

The load generator shares the loop with admission and the engine, and time_scale 0.2 magnifies any
pause of that loop five times in simulated seconds, so it is kept cheap: prompts are slices of one
random pool, and the garbage collector runs between runs, not during them. A loaded machine still
shows: under heavy CPU contention a 50 ms descheduling is 250 simulated ms of TTFT; rerun (or raise
--time-scale) before trusting a p99 that an outlier could make.

    .venv/bin/python bench/fairness.py [--duration 60] [--time-scale 0.2] [--only weights,noisy,ramp,hog]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import math
import random
import time

from inferd.admission import AdmissionQueue, AdmissionRejected
from inferd.config import AdmissionConfig, PriorityClass, TenantConfig, TenantRegistry
from inferd.engine.sim import SimEngine
from inferd.types import GenerationRequest, SamplingParams

ENGINE = dict(max_batch_size=32, num_kv_blocks=4096, max_num_tokens=2048, seed=0)
PROFILE = "llama3-8b-h100"
TTFT_SLO_S, TPOT_SLO_S = 1.0, 0.1
OURS = AdmissionConfig()
FCFS = AdmissionConfig(scheduling="fcfs", early_refusal=False, headroom_fraction=0.0,
                       interactive_ttl_s=1e9, standard_ttl_s=1e9, batch_ttl_s=1e9)


# Prompts are slices of one random pool: drawing 512 ids per request cost ~0.35 ms of the loop the
# admission queue and the engine run on, ~25% of a core at the noisy scenario's flood rate (x5 in
# simulated time at time_scale 0.2), which showed up as queueing that no server would have.
_POOL = tuple(random.Random(0).randrange(300, 30000) for _ in range(1 << 16))


def make_request(rng: random.Random, tenant: str, n: int) -> GenerationRequest:
    prompt = rng.randint(256, 768)
    start = rng.randrange(len(_POOL) - prompt)
    return GenerationRequest(request_id=f"{tenant}-{n}", tenant=tenant, prompt_token_ids=_POOL[start:start + prompt],
                             sampling=SamplingParams(max_tokens=rng.randint(64, 192), ignore_eos=True))


async def calibrate(n: int = 400) -> float:
    """Requests per simulated second the engine serves at saturation, for this request mix."""
    engine = SimEngine(PROFILE, time_scale=0.0, **ENGINE)
    await engine.start()
    rng = random.Random(1)
    streams = [engine.submit(make_request(rng, "cal", i)) for i in range(n)]
    await asyncio.gather(*(s.collect() for s in streams))
    await engine.close()
    return n / engine.sim_time


def poisson(rng: random.Random, rate_at, duration: float, peak: float) -> list[float]:
    """Arrival times of a Poisson process with rate rate_at(t) <= peak (thinning)."""
    t, out = 0.0, []
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return out
        if rng.random() < rate_at(t) / peak:
            out.append(t)


class Record:
    __slots__ = ("tenant", "arrival", "ttft", "tpot", "end", "rejected", "status", "reject_wall_ms", "ok")

    def __init__(self, tenant: str, arrival: float) -> None:
        self.tenant, self.arrival = tenant, arrival
        self.ttft = self.tpot = self.end = None
        self.rejected = self.status = None
        self.reject_wall_ms = None
        self.ok = False


async def run(policy: AdmissionConfig, tenants: dict[str, TenantConfig], arrivals: list[tuple[float, str]],
              scale: float, deadline_s: float, duration: float, grace: float, seed: int, *,
              request_for=make_request, engine_class=SimEngine):
    """One run, bounded in wall time: a run that overstays (a bug) raises TimeoutError, never hangs.
    `request_for(rng, tenant, n)` makes each request; `engine_class` is the sim (or a variant of it)."""
    bound = (duration + grace) * scale * 3 + 30
    # A full collection stalls the loop ~35 ms, 175 simulated ms at time_scale 0.2: a pause no GPU
    # server would show at that size. Collect before, not during, each run.
    gc.collect()
    gc.disable()
    try:
        return await asyncio.wait_for(_run(policy, tenants, arrivals, scale, deadline_s, duration, grace, seed,
                                           request_for, engine_class), bound)
    finally:
        gc.enable()


async def _run(policy, tenants, arrivals, scale, deadline_s, duration, grace, seed, request_for, engine_class):
    loop = asyncio.get_running_loop()
    engine = engine_class(PROFILE, time_scale=scale, **ENGINE)
    await engine.start()
    clock = lambda: loop.time() / scale  # noqa: E731  simulated seconds
    queue = AdmissionQueue(engine, policy, TenantRegistry(tenants), clock=clock, time_scale=scale)
    queue.start()
    rng = random.Random(seed)
    records: list[Record] = []
    served: dict[str, float] = {}       # cost delivered within [0, duration)
    t0 = clock()

    def charge(tenant: str, cost: float) -> None:
        if clock() - t0 < duration:
            served[tenant] = served.get(tenant, 0.0) + cost

    async def client(rec: Record, request: GenerationRequest) -> None:
        wall0 = time.perf_counter()
        try:
            stream = await queue.admit(request, deadline=clock() + deadline_s)
        except AdmissionRejected as exc:
            rec.rejected, rec.status = exc.reason, exc.status
            rec.reject_wall_ms = (time.perf_counter() - wall0) * 1000
            return
        first, n_out = None, 0
        try:
            async for delta in stream:
                if delta.token_ids:
                    if first is None:
                        first = clock()
                        charge(request.tenant, len(request.prompt_token_ids))
                    n_out += len(delta.token_ids)
                    charge(request.tenant, 2 * len(delta.token_ids))
        except asyncio.CancelledError:
            stream.cancel()
            raise
        rec.end = clock()
        if first is not None:
            rec.ttft = first - rec.arrival
            rec.tpot = (rec.end - first) / max(1, n_out - 1)
            rec.ok = rec.ttft <= TTFT_SLO_S and rec.tpot <= TPOT_SLO_S

    tasks = []
    for i, (at, tenant) in enumerate(arrivals):
        delay = (t0 + at - clock()) * scale
        if delay > 0:
            await asyncio.sleep(delay)
        rec = Record(tenant, t0 + at)
        records.append(rec)
        tasks.append(loop.create_task(client(rec, request_for(rng, tenant, i))))
    end_at = t0 + (arrivals[-1][0] if arrivals else 0) + grace
    pending = [t for t in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=max(0.0, (end_at - clock()) * scale))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await queue.close()
    await engine.close()
    for r in records:
        r.arrival -= t0
        if r.end is not None:
            r.end -= t0
    return records, served


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, int(math.ceil(q * len(values))) - 1)]


def ttfts(records, tenant):
    """TTFTs of every admitted-or-not request of a tenant that was not refused; unfinished = inf."""
    return [r.ttft if r.ttft is not None else math.inf for r in records if r.tenant == tenant and r.rejected is None]


async def scenario_weights(cap, args):
    rng = random.Random(11)
    arrivals = sorted([(t, "A") for t in poisson(rng, lambda t: cap, args.duration, cap)]
                      + [(t, "B") for t in poisson(rng, lambda t: cap, args.duration, cap)])
    tenants = {"A": TenantConfig(weight=3), "B": TenantConfig(weight=1)}
    print(f"\n[weights] A (weight 3) and B (weight 1) each send {cap:.1f} req/s (1x capacity) for "
          f"{args.duration:.0f} s; service share by cost over the run (target 75/25 +/- 5)")
    for name, policy in (("ours", OURS), ("fcfs", FCFS)):
        records, served = await run(policy, tenants, arrivals, args.time_scale, 600.0, args.duration, 0.0, 1)
        total = sum(served.values()) or 1
        print(f"  {name:<5} share A {100 * served.get('A', 0) / total:5.1f}%  B {100 * served.get('B', 0) / total:5.1f}%"
              f"   served cost {total / args.duration:8.0f}/s   rejected A {sum(r.tenant == 'A' and r.rejected is not None for r in records)}"
              f" B {sum(r.tenant == 'B' and r.rejected is not None for r in records)}")


async def scenario_noisy(cap, args):
    rng = random.Random(12)
    w = [(t, "W") for t in poisson(rng, lambda t: 0.2 * cap, args.duration, 0.2 * cap)]
    n = [(t, "N") for t in poisson(rng, lambda t: 5 * cap, args.duration, 5 * cap)]
    tenants = {"W": TenantConfig(), "N": TenantConfig()}
    print(f"\n[noisy] W sends {0.2 * cap:.1f} req/s (0.2x) beside N flooding {5 * cap:.0f} req/s (5x); "
          f"W's TTFT (target: p99 with N <= 1.5x p99 alone)")
    for name, policy in (("ours", OURS), ("fcfs", FCFS)):
        alone, _ = await run(policy, tenants, w, args.time_scale, 60.0, args.duration, args.grace, 2)
        mixed, _ = await run(policy, tenants, sorted(w + n), args.time_scale, 60.0, args.duration, args.grace, 2)
        a99, m99 = pct(ttfts(alone, "W"), 0.99), pct(ttfts(mixed, "W"), 0.99)
        print(f"  {name:<5} W p50/p99 TTFT alone {pct(ttfts(alone, 'W'), 0.5):6.3f}/{a99:6.3f} s   with N "
              f"{pct(ttfts(mixed, 'W'), 0.5):6.3f}/{m99:6.3f} s   ratio {m99 / a99:6.2f}x   "
              f"W refused {sum(r.tenant == 'W' and r.rejected is not None for r in mixed)}/{len(w)}")


async def scenario_ramp(cap, args):
    rng = random.Random(13)
    d = args.duration
    rate = lambda t: cap * (0.5 + 2.5 * t / d)  # noqa: E731
    arrivals = [(t, f"T{i % 4}") for i, t in enumerate(poisson(rng, rate, d, 3 * cap))]
    tenants = {f"T{i}": TenantConfig(priority=PriorityClass.INTERACTIVE) for i in range(4)}
    ours = AdmissionConfig(interactive_ttl_s=TTFT_SLO_S)   # a queue wait beyond the TTFT SLO is a miss anyway
    win = d / 6
    print(f"\n[ramp] 4 interactive tenants, load 0.5x -> 3x capacity ({0.5 * cap:.0f} -> {3 * cap:.0f} req/s) "
          f"over {d:.0f} s; goodput = requests/s finishing with TTFT <= {TTFT_SLO_S} s and per-token <= "
          f"{TPOT_SLO_S * 1000:.0f} ms, per {win:.0f} s window (target: last >= 90% of peak; p99 rejection < 5 ms)")
    for name, policy in (("ours", ours), ("fcfs", FCFS)):
        records, _ = await run(policy, tenants, arrivals, args.time_scale, 30.0, d, 0.0, 3)
        good = [sum(1 for r in records if r.ok and k * win <= r.end < (k + 1) * win) / win for k in range(6)]
        rej = [r.reject_wall_ms for r in records if r.rejected is not None]
        peak = max(good) or 1
        reasons: dict[str, int] = {}
        for r in records:
            if r.rejected is not None:
                reasons[f"{r.status} {r.rejected}"] = reasons.get(f"{r.status} {r.rejected}", 0) + 1
        print(f"  {name:<5} goodput/s " + " ".join(f"{g:5.1f}" for g in good)
              + f"   last/peak {100 * good[-1] / peak:5.1f}%   rejected {len(rej)}/{len(records)} "
              f"p99 time to rejection {pct(rej, 0.99):7.2f} ms  {reasons}")


HOG_TOKENS = 7000
# The engine's default pool: beta's contexts outgrow it, so the engine preempts for blocks (from the
# tenant holding the most per weight: inferd.engine.victims). --hog-kv-blocks 16384 holds every hog
# stream whole (a scenario about slots only). The "kv hog" lines: beta holds only half the slots, and
# with long prompts the whole KV cache (admission has it yield KV to alpha: inferd.admission.slots).
HOG_KV_BLOCKS = 4096
HOG_GRACE_S = 150.0        # simulated seconds: beta's streams end well within it


def hog_sim(profile, **kwargs) -> SimEngine:
    return SimEngine(profile, **{**kwargs, "num_kv_blocks": HOG_KV_BLOCKS})


def set_hog_kv_blocks(n: int) -> None:
    global HOG_KV_BLOCKS
    HOG_KV_BLOCKS = n


def hog_request(rng: random.Random, tenant: str, n: int, prompt: int = 512) -> GenerationRequest:
    """beta's are long streams that never stop early; alpha's the usual mix."""
    if tenant != "beta":
        return make_request(rng, tenant, n)
    start = rng.randrange(len(_POOL) - prompt)
    return GenerationRequest(request_id=f"{tenant}-{n}", tenant=tenant, prompt_token_ids=_POOL[start:start + prompt],
                             sampling=SamplingParams(max_tokens=HOG_TOKENS, ignore_eos=True))


KV_HOG_PROMPT = 1192       # + HOG_TOKENS: the profile's whole 8,192-token context


def kv_hog_request(rng: random.Random, tenant: str, n: int) -> GenerationRequest:
    """The KV hog: beta's streams start from long prompts, so half the slots fill the KV cache soon."""
    return hog_request(rng, tenant, n, KV_HOG_PROMPT)


class NoPreemptSim(SimEngine):
    """The sim as an engine that cannot preempt (as trtllm's executor): admission keeps a reserve instead."""

    yields_slots = False

    def yield_slot(self, request_id: str) -> bool:
        return False


def no_preempt_hog_sim(profile, **kwargs) -> SimEngine:
    return NoPreemptSim(profile, **{**kwargs, "num_kv_blocks": HOG_KV_BLOCKS})


async def scenario_hog(cap, args):
    slots = ENGINE["max_batch_size"]
    rate = 0.03 * cap
    rng = random.Random(14)
    # beta's burst is spread so that each request is released as it comes (nothing queued: no light
    # arrival beside a backlog opens the headroom window) and it holds every slot before alpha's first
    start = 0.1 * slots + 1.0
    alpha = [(start + t, "alpha") for t in poisson(rng, lambda t: rate, args.duration, rate)]
    beta = [(0.1 * i, "beta") for i in range(slots)]
    tenants = {"alpha": TenantConfig(), "beta": TenantConfig()}
    print(f"\n[hog] ({HOG_KV_BLOCKS} KV blocks) beta fills all {slots} slots with {HOG_TOKENS}-token streams (ignore_eos) from t=0; alpha sends "
          f"{rate:.1f} req/s from t={start:.1f} s for {args.duration:.0f} s; alpha's TTFT (target: p99 with the hog <= 1.5x "
          f"p99 alone)")
    variants = [("preempt", OURS, hog_sim), ("reserve", OURS, no_preempt_hog_sim)]
    if "fairness_preemption" in AdmissionConfig.__struct_fields__:
        variants.insert(1, ("no-preempt", AdmissionConfig(fairness_preemption=False), hog_sim))
    else:   # a tree before fair slots: its only behaviour
        variants = [("before", OURS, hog_sim)]
    for name, policy, engine_class in variants:
        alone, _ = await run(policy, tenants, alpha, args.time_scale, 600.0, args.duration, args.grace, 4,
                             request_for=hog_request, engine_class=engine_class)
        # grace for the hog to end: where nothing frees a slot, alpha's TTFT is the rest of beta's streams
        mixed, _ = await run(policy, tenants, sorted(alpha + beta), args.time_scale, 600.0, args.duration,
                             max(args.grace, HOG_GRACE_S), 4, request_for=hog_request, engine_class=engine_class)
        a99, m99 = pct(ttfts(alone, "alpha"), 0.99), pct(ttfts(mixed, "alpha"), 0.99)
        label = "slot hog" if name in ("preempt", "before") else f"slot hog ({name})"
        print(f"  {label}: alpha ttft p99 alone: {a99:.3f} s")
        print(f"  {label}: alpha ttft p99 with hog: {m99:.3f} s")
        print(f"  {label}: p99 ratio: {m99 / a99:.2f}x")
        print(f"  {label}: alpha ttft p50 alone/with hog: {pct(ttfts(alone, 'alpha'), 0.5):.3f}/"
              f"{pct(ttfts(mixed, 'alpha'), 0.5):.3f} s; beta streams running at the end: "
              f"{sum(r.tenant == 'beta' and r.end is None for r in mixed)}/{slots}")
        if name in ("preempt", "before"):
            await kv_hog(alpha, alone, policy, engine_class, args)


async def kv_hog(alpha, alone, policy, engine_class, args):
    """beta holds half the slots (its share beside alpha) but, from long prompts, the whole KV cache."""
    half = ENGINE["max_batch_size"] // 2
    beta = [(0.1 * i, "beta") for i in range(half)]
    mixed, _ = await run(policy, {"alpha": TenantConfig(), "beta": TenantConfig()}, sorted(alpha + beta),
                         args.time_scale, 600.0, args.duration, max(args.grace, HOG_GRACE_S), 4,
                         request_for=kv_hog_request, engine_class=engine_class)
    a99, m99 = pct(ttfts(alone, "alpha"), 0.99), pct(ttfts(mixed, "alpha"), 0.99)
    print(f"  kv hog: beta streams: {half} of {KV_HOG_PROMPT} + {HOG_TOKENS} tokens ({HOG_KV_BLOCKS} KV blocks)")
    print(f"  kv hog: alpha ttft p99 with hog: {m99:.3f} s")
    print(f"  kv hog: p99 ratio: {m99 / a99:.2f}x")
    def tpot99(records):
        return pct([r.tpot if r.tpot is not None else math.inf for r in records
                    if r.tenant == "alpha" and r.rejected is None], 0.99)

    print(f"  kv hog: alpha time per output token p99 alone/with hog: {1000 * tpot99(alone):.1f}/"
          f"{1000 * tpot99(mixed):.1f} ms")
    print(f"  kv hog: alpha ttft p50 with hog: {pct(ttfts(mixed, 'alpha'), 0.5):.3f} s; alpha unfinished: "
          f"{sum(r.tenant == 'alpha' and r.ttft is None and r.rejected is None for r in mixed)}; refused: "
          f"{sum(r.tenant == 'alpha' and r.rejected is not None for r in mixed)}")


async def main(args) -> None:
    set_hog_kv_blocks(args.hog_kv_blocks)
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    cap = await calibrate()
    print(f"sim engine {PROFILE} {ENGINE}; prompts 256-768, outputs 64-192 tokens; capacity {cap:.1f} req/s "
          f"(simulated); time_scale {args.time_scale} (simulated seconds below)")
    only = set(args.only.split(","))
    for name, fn in (("weights", scenario_weights), ("noisy", scenario_noisy), ("ramp", scenario_ramp),
                     ("hog", scenario_hog)):
        if name in only:
            await fn(cap, args)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=60.0, help="simulated seconds of arrivals per run")
    p.add_argument("--time-scale", type=float, default=0.2, help="wall seconds per simulated second")
    p.add_argument("--grace", type=float, default=15.0, help="simulated seconds allowed after the last arrival")
    p.add_argument("--only", default="weights,noisy,ramp,hog")
    p.add_argument("--hog-kv-blocks", type=int, default=HOG_KV_BLOCKS,
                   help="the hog scenario's KV pool (fewer: beta's contexts outgrow it, see HOG_KV_BLOCKS)")
    asyncio.run(main(p.parse_args()))
