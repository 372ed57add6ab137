"""Model lifecycle under a memory budget: LRU + minimum-residency hysteresis vs plain LRU.

What this is: a discrete-event simulation, in simulated time, of the daemon's lifecycle DECISIONS, made
by the real policy object (inferd.models.residency.Residency, its clock the simulation's). It is not
the daemon's request path: lazy loading, the admin routes and the metrics do not exist yet, so nothing
here goes through HTTP, admission or an engine. What it models, on one device:

- `--models` versions of one sim profile (default llama3-8b-h100), each with footprint = weights + a KV
  pool of `--kv-pool-gib`; the budget holds exactly `--room` of them (the defaults: four bf16 8B
  models with a 4 GiB pool each, 76 GiB, are one 80 GiB H100). A load takes the profile's
  `load_time_s()` (weights / load_bandwidth + setup: 8.5 s for the default profile) and runs one at a
  time (a FIFO load queue); an eviction is instant (no request in flight, by the policy).
- Open-loop Poisson arrivals at `--rate`, the model drawn by Zipf(`--zipf-s`) over the ranks; with
  `--drift-period-s`, every period the least popular model becomes the most popular and every other
  one moves down a rank (a new tenant's burst, the traffic hysteresis is meant for). One seeded
  arrival sequence is replayed for both policies.
- A hot model serves up to `--concurrency` requests at once (the rest wait FIFO); each takes the
  profile's time for a typical request, one prefill of `--isl` tokens then `--osl` decode steps at a
  batch of `--concurrency` (SimProfile.step_time / decode_step_time); models on the device do not
  slow each other (compute is not what this bench is about: at the default rate a model uses a few
  percent of its slots). A request counts as in flight (Residency.acquire/release) from the moment it
  reaches a hot model until it finishes, so a model with work is never evicted.
- A request for a model that is not hot is a cold start, decided as the daemon decides it
  (inferd.models.memory_budget): it joins the model's load if one is queued or under way (concurrent
  requests share one load); else, with the device idle and nothing the policy may evict
  (`plan_load` -> NoRoom) but for versions serving requests, it is refused at once (503 with NoRoom's
  Retry-After) and nothing is queued; else its load is queued. It then waits if the estimate of when
  the model will be hot (the load under way, the loads queued ahead, its own) fits its deadline (`--timeout-s` after arrival, a
  client's or gateway's timeout), else it is refused at once (503, Retry-After the estimate) and the
  load still happens, so that retrying then finds the model hot. When the device is free the head of
  the load queue is planned: LoadPlan -> evict, load; NoRoom because every candidate has requests in
  flight -> planned again when one ends; other NoRoom -> the load is dropped and its waiters get 503
  (a wait on "when something may be evictable" could slip for ever, as every request on a hot model
  resets it). A waiting request whose deadline passes times out (504): nothing waits for ever.
- A request is good when its first token (model hot, a slot, the prefill) comes within `--slo-s` of
  its arrival: a hit meets it, a cold start (8.5 s of load) never does. Goodput = good / duration.

Figures per policy: hit rate (the model was hot when the request arrived), loads and cold-start
requests, cold-start wait p50/p99 (arrival to first token of cold starts that were served), goodput at
the SLO, refused (503) and timed out (504), evictions per minute, and the distinct models requested
per minute (the traffic's, the same for both). The verdict is computed from them: the issue's goal is
LRU + hysteresis >= plain LRU on hit rate, cold-start p50, cold-start p99 and goodput, and no eviction
storm: in every whole minute of the run, evictions <= 2 x the distinct models requested that minute.

Defaults, and why they stand for production: 12 fine-tuned versions of an 8B model with room for 4
(the issue's shape); 0.5 req/s over all of them (lazy loading is for a node hosting a long tail of
low-traffic fine-tunes: one 8B model alone could serve 20+ req/s, so a node that busy would dedicate
its GPU; here the most popular model sees ~10 requests a minute, the least popular under 1); Zipf s = 1.1
(request popularity across models and tenants is commonly Zipf with s near 1); popularity drifting one
rank every 10 minutes (a tenant's batch job or session lasts minutes, not hours) over one simulated
hour; a 2 s TTFT SLO; a 30 s client timeout (long enough to sit out one cold start, shorter than a
queue of them); minimum residency 3 x the load time (hysteresis has to outlast a load to stop two
models trading places; much longer pins a one-off tail request's model in a slot the popular ones
need). Mind that one load at a time caps evictions at 60 / load time per minute (7 with 8.5 s loads):
with realistic load times the storm check cannot fail while 4 or more models are requested a minute;
fast loads (--profile tiny, 0.5 s) are where plain LRU storms.

    python bench/lifecycle.py [--rate 0.5] [--zipf-s 1.1] [--drift-period-s 600] [--min-residency-s 25.6] [--json]
Deterministic for a seed; pure Python, no engine, no network: under a second with the defaults.
"""
from __future__ import annotations

import argparse
import bisect
import heapq
import itertools
import json
import math
import random
import sys
from collections import deque
from dataclasses import dataclass

from inferd.engine.sim.profiles import GiB, get_profile
from inferd.models.residency import HOT, LoadPlan, NoRoom, Residency

POLICIES = ("lru", "hysteresis")     # plain LRU (min_residency_s = 0), LRU + minimum residency
LABELS = {"lru": "plain LRU", "hysteresis": "LRU+hysteresis"}


@dataclass(slots=True)
class Request:
    rid: int
    arrival: float
    model: int
    deadline: float
    cold: bool = False
    outcome: str = ""                 # "served" | "refused" | "timed_out"; "" while waiting or running
    ttft: float | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    load_s: float                     # one model's load time
    footprint: int                    # bytes: weights + KV pool
    prefill_s: float                  # a typical request's prefill step
    service_s: float                  # a typical request, prefill + decode


def workload(args) -> Workload:
    p = get_profile(args.profile)
    footprint = int(p.weight_bytes_per_gpu + args.kv_pool_gib * GiB)
    prefill = p.step_time(args.isl, args.isl, args.isl * (args.isl + 1) // 2)
    decode = sum(p.decode_step_time(args.concurrency, args.isl + k) for k in range(args.osl))
    return Workload(p.load_time_s(), footprint, prefill, prefill + decode)


def zipf_cdf(n: int, s: float) -> list[float]:
    weights = [1.0 / (rank + 1) ** s for rank in range(n)]
    total, acc, cdf = sum(weights), 0.0, []
    for w in weights:
        acc += w
        cdf.append(acc / total)
    cdf[-1] = 1.0
    return cdf


def arrivals(args) -> list[tuple[float, int]]:
    """(time, model) pairs: Poisson at args.rate, ranks drawn by Zipf, ranks rotated every drift period
    (at epoch e the model at rank r is (r - e) mod n: the least popular one becomes the most popular)."""
    rng = random.Random(args.seed)
    cdf = zipf_cdf(args.models, args.zipf_s)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(args.rate)
        if t >= args.duration_s:
            return out
        rank = bisect.bisect_left(cdf, rng.random())
        epoch = int(t // args.drift_period_s) if args.drift_period_s > 0 else 0
        out.append((t, (rank - epoch) % args.models))


class Sim:
    """One policy over one arrival sequence. Events: (time, seq, kind, payload) on a heap."""

    def __init__(self, args, work: Workload, min_residency_s: float) -> None:
        self.args, self.work = args, work
        self.now = 0.0
        self.res = Residency(args.room * work.footprint, min_residency_s=min_residency_s, clock=lambda: self.now)
        for m in range(args.models):
            self.res.register(m, work.footprint)
        self.events: list = []
        self.seq = itertools.count()
        self.waiters: dict[int, list[Request]] = {m: [] for m in range(args.models)}
        self.wanted: set[int] = set()            # queued loads a refused request asked for (no waiter needed)
        self.load_queue: deque[int] = deque()
        self.loading: int | None = None
        self.busy_until = 0.0
        self.free = {m: args.concurrency for m in range(args.models)}
        self.fifo: dict[int, deque[Request]] = {m: deque() for m in range(args.models)}
        self.requests: list[Request] = []
        self.loads: list[float] = []             # load start times
        self.evictions: list[float] = []
        self.victim_ages: list[float] = []       # how long each victim had been hot
        self.refusals: dict[str, int] = {}
        self.max_queue = 0

    def at(self, t: float, kind: str, payload=None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def run(self, schedule: list[tuple[float, int]]) -> None:
        for rid, (t, m) in enumerate(schedule):
            self.at(t, "arrive", Request(rid, t, m, t + self.args.timeout_s))
        handlers = {"arrive": self.arrive, "load_done": self.load_done, "finish": self.finish,
                    "timeout": self.timeout}
        while self.events:
            self.now, _, kind, payload = heapq.heappop(self.events)
            handlers[kind](payload)
        unfinished = [r for r in self.requests if not r.outcome]
        assert not unfinished, f"{len(unfinished)} requests never ended"

    # -- requests ------------------------------------------------------------------------
    def arrive(self, req: Request) -> None:
        self.requests.append(req)
        if self.res.state(req.model) == HOT:
            self.admit(req)
            return
        req.cold = True
        m = req.model
        if m != self.loading and m not in self.load_queue:
            plan = self.res.plan_load(m) if self.loading is None and not self.load_queue else None
            if isinstance(plan, NoRoom) and plan.reason != "in_flight":
                self.refuse(req, "no_room")     # nothing may be evicted now: 503 at once, no load queued
                return
            self.load_queue.append(m)           # loads even if this request cannot wait for it, so that
            self.max_queue = max(self.max_queue, len(self.load_queue))   # its Retry-After is honest
        if self.estimate_ready(m) > req.deadline:
            self.refuse(req, "deadline")
            self.wanted.add(m)
        else:
            self.waiters[m].append(req)
            self.at(req.deadline, "timeout", req)
        self.pump()

    def refuse(self, req: Request, reason: str) -> None:
        req.outcome = "refused"
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def estimate_ready(self, m: int) -> float:
        """When `m` (loading or queued) would be hot, as the daemon would estimate it at this request's
        arrival: the load under way, then every load queued ahead, then its own."""
        if m == self.loading:
            return self.busy_until
        head = self.busy_until if self.loading is not None else self.now
        return head + (self.load_queue.index(m) + 1) * self.work.load_s

    def admit(self, req: Request) -> None:
        """`req` reaches its hot model: in flight from now (never evicted under it), a slot or the FIFO."""
        self.res.acquire(req.model)
        if self.free[req.model] > 0:
            self.start(req)
        else:
            self.fifo[req.model].append(req)

    def start(self, req: Request) -> None:
        self.free[req.model] -= 1
        req.ttft = self.now + self.work.prefill_s - req.arrival
        req.outcome = "served"
        self.at(self.now + self.work.service_s, "finish", req)

    def finish(self, req: Request) -> None:
        m = req.model
        self.free[m] += 1
        self.res.release(m)
        if self.loading is None and self.load_queue:
            self.pump()                          # a load waiting for requests in flight to end
        queue = self.fifo[m]
        while queue and self.free[m] > 0:
            nxt = queue.popleft()
            if self.now > nxt.deadline:          # waited past its deadline for a slot
                nxt.outcome = "timed_out"
                self.res.release(m)
            else:
                self.start(nxt)

    def timeout(self, req: Request) -> None:
        if req.outcome or req not in self.waiters[req.model]:
            return
        self.waiters[req.model].remove(req)
        req.outcome = "timed_out"
        self.pump()                              # the queue head may have nobody left waiting for it

    # -- the device's load queue -------------------------------------------------------------
    def pump(self) -> None:
        """Start the next load when the device is free and the policy finds room."""
        if self.loading is not None:
            return
        while self.load_queue:
            m = self.load_queue[0]
            if not self.waiters[m] and m not in self.wanted:
                self.load_queue.popleft()        # everyone waiting for it gave up: do not load it
                continue
            plan = self.res.plan_load(m)
            if isinstance(plan, LoadPlan):
                break
            if plan.reason == "in_flight":
                return                           # the next request to end may free a version: plan again then
            # The daemon's rule: a load whose turn comes with nothing evictable is dropped, and whoever
            # waits for it gets 503 with NoRoom's Retry-After (never a wait on an estimate that can slip).
            self.load_queue.popleft()
            self.wanted.discard(m)
            waiting, self.waiters[m] = self.waiters[m], []
            for req in waiting:
                self.refuse(req, "no_room")
        else:
            return
        self.load_queue.popleft()
        self.wanted.discard(m)
        for victim in plan.evict:
            self.victim_ages.append(self.now - self.res.versions[victim].loaded_at)
            assert self.res.evicting(victim), "the policy chose a victim with requests in flight"
            self.res.unloaded(victim)
            self.evictions.append(self.now)
        self.res.loading(m)
        self.loading, self.busy_until = m, self.now + self.work.load_s
        self.loads.append(self.now)
        self.at(self.busy_until, "load_done", m)

    def load_done(self, m: int) -> None:
        self.res.warming(m, self.work.footprint)
        self.res.hot(m)
        self.loading = None
        waiting, self.waiters[m] = self.waiters[m], []
        for req in waiting:
            self.admit(req)
        self.pump()


# -- figures ---------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def per_minute(times: list[float], minutes: int) -> list[int]:
    counts = [0] * minutes
    for t in times:
        if int(t // 60) < minutes:
            counts[int(t // 60)] += 1
    return counts


def distinct_per_minute(schedule: list[tuple[float, int]], minutes: int) -> list[int]:
    seen: list[set[int]] = [set() for _ in range(minutes)]
    for t, m in schedule:
        if int(t // 60) < minutes:
            seen[int(t // 60)].add(m)
    return [len(s) for s in seen]


def figures(sim: Sim, schedule, args) -> dict:
    reqs = sim.requests
    n = len(reqs)
    served = [r for r in reqs if r.outcome == "served"]
    cold_served = [r.ttft for r in served if r.cold]
    minutes = int(args.duration_s // 60)
    evictions_by_minute = per_minute(sim.evictions, minutes)
    distinct = distinct_per_minute(schedule, minutes)
    storms = [i for i in range(minutes) if evictions_by_minute[i] > 2 * distinct[i]]
    in_window = [t for t in sim.evictions if t < args.duration_s]
    good = sum(1 for r in served if r.ttft <= args.slo_s)
    return {
        "min_residency_s": sim.res.min_residency_s,
        "requests": n,
        "hits": n - sum(r.cold for r in reqs),
        "hit_rate": (n - sum(r.cold for r in reqs)) / n if n else 0.0,
        "cold_requests": sum(r.cold for r in reqs),
        "cold_served": len(cold_served),
        "cold_wait_p50_s": pct(cold_served, 0.50),
        "cold_wait_p99_s": pct(cold_served, 0.99),
        "good": good,
        "goodput": good / args.duration_s,
        "good_share": good / n if n else 0.0,
        "refused": sum(r.outcome == "refused" for r in reqs),
        "refusals": dict(sorted(sim.refusals.items())),
        "timed_out": sum(r.outcome == "timed_out" for r in reqs),
        "served": len(served),
        "loads": len(sim.loads),
        "load_busy_share": len(sim.loads) * sim.work.load_s / max(sim.now, args.duration_s),
        "max_load_queue": sim.max_queue,
        "evictions": len(sim.evictions),
        "evictions_per_min": len(in_window) / (args.duration_s / 60),
        "max_evictions_in_a_minute": max(evictions_by_minute, default=0),
        "storm_minutes": len(storms),
        "min_victim_age_s": min(sim.victim_ages, default=None),
    }


# (name, key, higher is better): the "every figure"
GOAL_FIGURES = (("hit rate", "hit_rate", True), ("cold-start p50", "cold_wait_p50_s", False),
                ("cold-start p99", "cold_wait_p99_s", False), ("goodput", "goodput", True))


def at_least_as_good(h, lru, higher: bool) -> bool | None:
    """None when a figure is missing on either side (no cold start was served): not comparable."""
    if h is None or lru is None:
        return None
    return h >= lru if higher else h <= lru


def verdict(result: dict) -> dict:
    h, lru = result["runs"]["hysteresis"], result["runs"]["lru"]
    per = {key: at_least_as_good(h[key], lru[key], higher) for _, key, higher in GOAL_FIGURES}
    worse = [name for name, key, _ in GOAL_FIGURES if per[key] is False]
    return {
        "per_figure": per,
        "worse_on": worse,
        "at_least_plain_lru_on_every_figure": not worse,
        "no_eviction_storm": {p: result["runs"][p]["storm_minutes"] == 0 for p in POLICIES},
    }


def run(args) -> dict:
    work = workload(args)
    min_res = args.min_residency_s if args.min_residency_s is not None else args.residency_loads * work.load_s
    schedule = arrivals(args)
    minutes = int(args.duration_s // 60)
    distinct = distinct_per_minute(schedule, minutes)
    runs = {}
    for policy, h in (("lru", 0.0), ("hysteresis", min_res)):
        sim = Sim(args, work, h)
        sim.run(schedule)
        runs[policy] = figures(sim, schedule, args)
    result = {
        "args": vars(args),
        "workload": {"load_s": work.load_s, "footprint_bytes": work.footprint,
                     "budget_bytes": args.room * work.footprint, "prefill_s": work.prefill_s,
                     "service_s": work.service_s, "min_residency_s": min_res},
        "offered": len(schedule),
        "distinct_per_min": sum(distinct) / minutes if minutes else None,
        "min_distinct_in_a_minute": min(distinct, default=None),
        "runs": runs,
    }
    result["verdict"] = verdict(result)
    return result


# -- output ----------------------------------------------------------------------------------------

def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict, args) -> str:
    w, lru, h = result["workload"], result["runs"]["lru"], result["runs"]["hysteresis"]
    lines = [
        f"{args.models} versions of {args.profile} (footprint {w['footprint_bytes'] / GiB:.1f} GiB, load "
        f"{w['load_s']:.1f} s), room for {args.room} ({w['budget_bytes'] / GiB:.1f} GiB), one load at a time",
        f"{args.rate:g} req/s Poisson for {args.duration_s:g} s simulated, Zipf s={args.zipf_s:g}, "
        + (f"ranks rotate every {args.drift_period_s:g} s" if args.drift_period_s > 0 else "no drift")
        + f"; request {args.isl}+{args.osl} tokens ({w['service_s']:.2f} s), {args.concurrency} per model at once",
        f"SLO: first token within {args.slo_s:g} s of arrival; client timeout {args.timeout_s:g} s; hysteresis = "
        f"min residency {w['min_residency_s']:.1f} s; seed {args.seed}; {result['offered']} requests; "
        f"one load at a time caps evictions at about {60 / w['load_s']:.1f}/minute",
        "",
        f"{'':28} {LABELS['lru']:>14} {LABELS['hysteresis']:>15}",
    ]
    rows = [
        ("hit rate", "hit_rate", ".1%"), ("cold-start requests", "cold_requests", "d"),
        ("  served after a load", "cold_served", "d"), ("cold-start wait p50 (s)", "cold_wait_p50_s", ".1f"),
        ("cold-start wait p99 (s)", "cold_wait_p99_s", ".1f"), ("goodput at SLO (req/s)", "goodput", ".3f"),
        ("  good / offered", "good_share", ".1%"), ("refused (503)", "refused", "d"),
        ("timed out (504)", "timed_out", "d"),
        ("loads", "loads", "d"), ("device busy loading", "load_busy_share", ".0%"),
        ("longest load queue", "max_load_queue", "d"), ("evictions per minute", "evictions_per_min", ".2f"),
        ("max evictions in a minute", "max_evictions_in_a_minute", "d"),
        ("youngest victim (s hot)", "min_victim_age_s", ".1f"),
    ]
    for label, key, spec in rows:
        lines.append(f"{label:28} {fmt(lru[key], spec):>14} {fmt(h[key], spec):>15}")
    lines.append(f"{'distinct models req/minute':28} {result['distinct_per_min']:>14.2f} "
                 f"{'(min ' + str(result['min_distinct_in_a_minute']) + ')':>15}")
    v = result["verdict"]
    marks = ", ".join(f"{name} {'>=' if v['per_figure'][key] else ('<' if v['per_figure'][key] is False else 'n/a')}"
                      for name, key, _ in GOAL_FIGURES)
    lines.append("")
    met = "MET" if v["at_least_plain_lru_on_every_figure"] else f"NOT MET (worse on {', '.join(v['worse_on'])})"
    lines.append(f"verdict: LRU+hysteresis vs plain LRU: {marks} -> at least plain LRU on every figure: {met}")
    storms = "; ".join(f"{LABELS[p]} {'none' if ok else str(result['runs'][p]['storm_minutes']) + ' minute(s) over'}"
                       for p, ok in v["no_eviction_storm"].items())
    lines.append(f"verdict: no eviction storms (every minute: evictions <= 2 x distinct models requested): {storms} -> "
                 + ("MET" if v["no_eviction_storm"]["hysteresis"] else "NOT MET") + " for LRU+hysteresis")
    for p in POLICIES:
        r = result["runs"][p]
        if r["refusals"]:
            lines.append(f"note: {LABELS[p]}: refusals by cause {r['refusals']} (no_room: nothing could be "
                         f"evicted when its load's turn came; deadline: its load would not be done in time)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="llama3-8b-h100", help="sim profile: weights, load time, step times")
    parser.add_argument("--models", type=int, default=12, help="model versions (one profile each)")
    parser.add_argument("--room", type=int, default=4, help="how many fit the budget at once")
    parser.add_argument("--kv-pool-gib", type=float, default=4.0, help="each model's KV pool, on top of its weights")
    parser.add_argument("--rate", type=float, default=0.5, help="arrivals per second, all models together")
    parser.add_argument("--duration-s", type=float, default=3600.0, help="simulated arrival window")
    parser.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent of model popularity")
    parser.add_argument("--drift-period-s", type=float, default=600.0,
                        help="every this many seconds the least popular model becomes the most popular (0: never)")
    parser.add_argument("--min-residency-s", type=float, default=None,
                        help="the hysteresis run's min_residency_s (default: --residency-loads x the load time)")
    parser.add_argument("--residency-loads", type=float, default=3.0, help="default min residency, in load times")
    parser.add_argument("--slo-s", type=float, default=2.0, help="a request is good when its first token is this soon")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="each request's deadline after its arrival")
    parser.add_argument("--isl", type=int, default=512, help="prompt tokens of a typical request")
    parser.add_argument("--osl", type=int, default=256, help="output tokens of a typical request")
    parser.add_argument("--concurrency", type=int, default=32, help="requests one hot model serves at once")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON document instead")
    args = parser.parse_args(argv)
    if args.models < 1 or not 1 <= args.room:
        parser.error("--models and --room: at least 1")
    if args.rate <= 0 or args.duration_s < 60:
        parser.error("--rate > 0 and --duration-s >= 60 (eviction storms are counted per minute)")
    if args.timeout_s < args.slo_s:
        parser.error("--timeout-s must be at least --slo-s")
    if args.min_residency_s is not None and args.min_residency_s < 0:
        parser.error("--min-residency-s: >= 0")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    outcome = run(arguments)
    print(json.dumps(outcome) if arguments.json else render(outcome, arguments))
    sys.exit(0)
