"""inferd.models.residency: the memory budget, LRU eviction with minimum residency, pins, in-flight
requests and draining, on integers and a test clock."""
from __future__ import annotations

import math

import pytest

from inferd.models.residency import COLD, DRAINING, HOT, LOADING, LoadPlan, NeverFits, NoRoom, Residency

GB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def resident(budget_gb: int = 2, min_residency_s: float = 60.0, **models) -> tuple[Residency, Clock]:
    clock = Clock()
    r = Residency(budget_gb * GB, min_residency_s=min_residency_s, clock=clock)
    for name, gb in (models or {"a": 1, "b": 1, "c": 1}).items():
        r.register(name, gb * GB)
    return r, clock


def load(r: Residency, key: str) -> None:
    plan = r.plan_load(key)
    assert isinstance(plan, LoadPlan), plan
    for victim in plan.evict:
        assert r.evicting(victim)
        r.unloaded(victim)
    r.loading(key)
    r.hot(key)


def test_a_version_that_fits_loads_without_evicting_and_counts_from_its_load_start():
    r, _ = resident()
    assert r.plan_load("a") == LoadPlan()
    r.loading("a")
    assert r.used_bytes() == GB and r.state("a") == LOADING     # two loads cannot count on the same bytes
    r.warming("a", measured_bytes=GB + 5)
    r.hot("a")
    assert r.used_bytes() == GB + 5 and r.state("a") == HOT


def test_the_least_recently_used_old_enough_version_is_evicted():
    r, clock = resident()
    load(r, "a")
    clock.now += 1
    load(r, "b")
    clock.now += 100
    r.acquire("a")
    r.release("a")                                  # a used more recently than b
    assert r.plan_load("c") == LoadPlan(("b",))


def test_hysteresis_keeps_a_recently_used_version_and_says_when_one_can_go():
    r, clock = resident(min_residency_s=60)
    load(r, "a")
    clock.now += 50
    load(r, "b")
    clock.now += 5
    plan = r.plan_load("c")
    assert isinstance(plan, NoRoom) and plan.reason == "min_residency"
    assert plan.retry_after_s == pytest.approx(5.0)  # a has been idle 60 s in 5 s
    clock.now += 5
    assert r.plan_load("c") == LoadPlan(("a",))


def test_the_minimum_residency_counts_from_the_last_use_not_from_the_load():
    r, clock = resident(min_residency_s=60)
    load(r, "a")
    clock.now += 1
    load(r, "b")
    clock.now += 100                                # both resident long enough, but...
    r.acquire("a")
    r.release("a")                                  # ...a was just used: only b may go
    assert r.plan_load("c") == LoadPlan(("b",))
    clock.now += 1
    r.acquire("b")
    r.release("b")
    plan = r.plan_load("c")                         # both used within the last minute: none may go
    assert isinstance(plan, NoRoom) and plan.reason == "min_residency"
    assert plan.retry_after_s == pytest.approx(59.0)


def test_plain_lru_evicts_at_once():
    r, clock = resident(min_residency_s=0)
    load(r, "a")
    load(r, "b")
    assert r.plan_load("c") == LoadPlan(("a",))


def test_pinned_and_busy_versions_never_leave():
    r, clock = resident(min_residency_s=0)
    r.register("a", GB, pinned=True)
    load(r, "a")
    load(r, "b")
    r.acquire("b")
    plan = r.plan_load("c")
    assert isinstance(plan, NoRoom) and plan.reason == "in_flight" and plan.retry_after_s == math.inf
    assert not r.release("b")
    assert r.plan_load("c") == LoadPlan(("b",))


def test_a_version_larger_than_the_unpinned_budget_can_never_load():
    r, _ = resident(budget_gb=2, a=1, big=2)
    r.register("a", GB, pinned=True)
    load(r, "a")
    with pytest.raises(NeverFits):
        r.plan_load("big")


def test_an_unload_with_requests_in_flight_drains_first():
    r, _ = resident()
    load(r, "a")
    r.acquire("a")
    assert not r.evicting("a") and r.state("a") == DRAINING
    assert r.release("a")                           # the last request ended: unload it now
    r.unloaded("a")
    assert r.state("a") == COLD and r.used_bytes() == 0


def test_a_failed_load_frees_its_bytes_and_transitions_are_checked():
    r, _ = resident()
    r.loading("a")
    r.failed("a")
    assert r.state("a") == COLD and r.used_bytes() == 0
    with pytest.raises(ValueError):
        r.hot("a")


def test_waiting_exactly_the_retry_after_finds_the_version_of_age():
    r, clock = resident(min_residency_s=30.1)
    clock.now = 1234.567
    load(r, "a")
    clock.now += 0.3
    load(r, "b")
    for _ in range(3):
        clock.now += 0.7
        plan = r.plan_load("c")
        assert isinstance(plan, NoRoom)
    clock.now += plan.retry_after_s
    assert isinstance(r.plan_load("c"), LoadPlan)


def test_recency_counts_from_when_a_request_ended_and_draining_is_said_as_in_flight():
    r, clock = resident(min_residency_s=0)
    load(r, "a")
    load(r, "b")
    r.acquire("a")                  # a's request starts first and ends last
    clock.now += 1
    r.acquire("b")
    r.release("b")
    clock.now += 1
    r.release("a")
    assert r.plan_load("c") == LoadPlan(("b",))
    r.acquire("a")
    assert not r.evicting("a")
    r.acquire("b")
    plan = r.plan_load("c")
    assert isinstance(plan, NoRoom) and plan.reason == "in_flight"
