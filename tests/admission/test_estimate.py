"""inferd.admission.estimate: the measured rate, expected cost, and the wait estimate behind early
refusals and Retry-After."""
import asyncio

import pytest

from inferd.admission.estimate import MIN_RETRY_S, UNKNOWN_RETRY_S, Estimator
from inferd.admission.fair_queue import AdmissionRejected
from inferd.config.tenants import AdmissionConfig
from tests.admission.harness import FakeEngine, far, make_queue, occupy, req, settle, spawn  # noqa: F401


async def test_hopeless_deadline_is_refused_at_once_from_the_wait_estimate(make_queue):
    engine = FakeEngine(tokens_per_s=100.0)
    q, _ = make_queue(engine=engine, early_refusal_fraction=1.0)
    q._estimate.measured_rate = 100.0                       # cost/s, as a saturated window measured it
    await occupy(q, engine)
    held = [spawn(q.admit(req("a", prompt=100, max_tokens=50), deadline=far()))
            for _ in range(4)]                              # 4 x (100 + 2*50) = 800 cost = 8 s of work
    await settle()
    loop = asyncio.get_running_loop()
    # b is served after only its fair share of a's backlog (200 cost = 2 s): 1 s is not enough.
    with pytest.raises(AdmissionRejected) as exc:
        await q.admit(req("b", prompt=100, max_tokens=50), deadline=loop.time() + 1.0)
    assert exc.value.reason == "deadline" and exc.value.status == 503
    assert exc.value.retry_after_s == pytest.approx(1.0, rel=0.05)   # ~2 s of wait - 1 s of budget
    with pytest.raises(AdmissionRejected) as own:                  # behind its own 8 s backlog: 429
        await q.admit(req("a", prompt=100, max_tokens=50), deadline=loop.time() + 2.0)
    assert own.value.status == 429 and own.value.retry_after_s == pytest.approx(6.0, rel=0.05)
    ok = spawn(q.admit(req("b", prompt=100, max_tokens=50), deadline=loop.time() + 3.0))
    await settle()
    assert not ok.done()                                    # enough budget: queued
    for t in held + [ok]:
        t.cancel()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_only_a_saturated_window_measures_capacity_an_idle_one_only_raises_it():
    clock = Clock()
    est = Estimator(FakeEngine(tokens_per_s=500.0), clock)
    clock.now = 10.0
    est.served(20.0)                  # the first request after 10 s of nothing: 2 cost/s, all idle time
    assert est.measured_rate is None and est.rate() == 500.0      # the engine's rate stands in
    clock.now = 10.5
    est.saturated()
    est.served(100.0)                 # 200 cost/s over a window where work waited on capacity
    assert est.measured_rate == 200.0
    clock.now = 11.0
    est.served(50.0)                  # 100/s while idle: a lower bound, not the capacity
    assert est.measured_rate == 200.0
    clock.now = 11.5
    est.saturated()
    est.served(50.0)                  # 100/s saturated: the estimate moves towards it
    assert est.measured_rate == pytest.approx(170.0)
    clock.now = 11.6
    est.served(1000.0)                # a window shorter than 0.25 s measures nothing yet
    assert est.measured_rate == pytest.approx(170.0)
    clock.now = 12.0
    est.served(1000.0)                # 2000 over 0.5 s unsaturated: above the estimate, it raises it
    assert est.measured_rate == pytest.approx(2000 / 0.5)


def test_retry_after_is_the_drain_time_of_the_needed_fraction_and_1s_with_no_rate_known():
    assert Estimator(FakeEngine(tokens_per_s=0.0), Clock()).retry_after(5.0, 0.5) == UNKNOWN_RETRY_S
    est = Estimator(FakeEngine(tokens_per_s=100.0), Clock())     # the engine's rate stands in
    assert est.rate() == 100.0
    assert est.retry_after(8.0, 0.25) == 2.0
    assert est.retry_after(8.0, 0.0) == 8.0                      # 0: all of it
    assert est.retry_after(0.001, 0.0) == MIN_RETRY_S


def test_cost_expects_the_recent_output_length_capped_by_max_tokens():
    est = Estimator(FakeEngine(), Clock())
    policy = AdmissionConfig(prompt_cost_weight=1.0, output_cost_weight=2.0)
    assert est.cost(req("a", prompt=16, max_tokens=100), policy) == 16 + 2 * 100
    est.observe_output(10)
    assert est.cost(req("a", prompt=16, max_tokens=100), policy) == 16 + 2 * 10
    assert est.cost(req("a", prompt=16, max_tokens=4), policy) == 16 + 2 * 4


async def test_a_burst_after_an_idle_start_is_not_refused_from_the_idle_time(make_queue):
    # The first rate window runs from the queue's creation to its first request: on a node that idled
    # (or started slowly, under CPU contention) it is mostly idle time, and taken for capacity it made
    # the wait estimate refuse most of the first burst (503 ttl).
    clock = Clock()
    engine = FakeEngine(slots=1, tokens_per_s=1000.0)
    q, _ = make_queue(engine=engine, clock=clock)
    clock.now = 30.0                                       # nothing for 30 s
    first = await q.admit(req("a", prompt=16, max_tokens=8), deadline=clock.now + 60)
    burst = [spawn(q.admit(req(t, prompt=16, max_tokens=8), deadline=clock.now + 60)) for t in "abc" * 16]
    await settle()
    assert not [t for t in burst if t.done()]              # all 48 queued behind the first, none refused
    assert q.snapshot()["queued"] == 48 and first.tenant == "a"


async def test_a_burst_is_not_refused_early_from_the_engines_own_rate_before_capacity_is_measured(make_queue):
    # The engine's tokens/s is what it ran at: on a GPU that served one request (or only its first cold
    # steps) a small fraction of what it serves full. Taken for capacity, it refused most of the first
    # burst of 256 streams on an H200 ("estimated queue wait 68 s"), though all of them started within
    # seconds.
    engine = FakeEngine(slots=1, tokens_per_s=10.0)        # 4 x (100 + 2*50) cost = 80 s at 10/s
    q, _ = make_queue(engine=engine, early_refusal_fraction=1.0)
    await occupy(q, engine)
    loop = asyncio.get_running_loop()
    burst = [spawn(q.admit(req("a", prompt=100, max_tokens=50), deadline=loop.time() + 5.0)) for _ in range(4)]
    await settle()
    assert not [t for t in burst if t.done()]              # queued, none refused early
    q._estimate.measured_rate = 10.0                       # a saturated window measured the same rate
    with pytest.raises(AdmissionRejected) as exc:          # now it is capacity: the estimate refuses
        await q.admit(req("a", prompt=100, max_tokens=50), deadline=loop.time() + 5.0)
    assert exc.value.status == 429
    for t in burst:
        t.cancel()
