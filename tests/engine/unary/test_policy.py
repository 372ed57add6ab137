"""The batch-closing rules, with plain numbers: caps, Wmax from the target, deadlines, baselines."""
from __future__ import annotations

import math

from inferd.engine.unary import DeadlineAware, FixedWindow, Limits, NoBatching, Pending


def linear(fixed: float, per_token: float):
    return lambda requests, tokens: fixed + per_token * tokens


LIMITS = Limits(max_requests=4, max_tokens=100)
EST = linear(0.005, 0.0001)         # 5 ms a batch + 0.1 ms a token


def pend(i: int, arrived: float, tokens: int = 10, deadline: float | None = None) -> Pending:
    return Pending(f"r{i}", tokens, arrived, deadline)


def test_no_batching_runs_one_request_at_once():
    plan = NoBatching().plan([pend(0, 0.0), pend(1, 0.0)], 0.0, EST, LIMITS, 1000.0)
    assert (plan.launch, plan.drop) == ((0,), ())
    assert NoBatching().plan([], 0.0, EST, LIMITS, 0.0).launch == ()


def test_fixed_window_waits_for_the_window_then_launches_what_it_has():
    policy = FixedWindow(0.010)
    plan = policy.plan([pend(0, 1.000), pend(1, 1.004)], 1.005, EST, LIMITS, 0.0)
    assert plan.launch == () and math.isclose(plan.wake_at, 1.010)
    assert policy.plan([pend(0, 1.000), pend(1, 1.004)], 1.010, EST, LIMITS, 0.0).launch == (0, 1)


def test_fixed_window_launches_a_full_batch_before_the_window():
    pending = [pend(i, 1.0) for i in range(6)]
    assert FixedWindow(0.010).plan(pending, 1.0, EST, LIMITS, 0.0).launch == (0, 1, 2, 3)     # the request cap
    heavy = [pend(i, 1.0, tokens=40) for i in range(3)]
    assert FixedWindow(0.010).plan(heavy, 1.0, EST, LIMITS, 0.0).launch == (0, 1)             # the token cap


def test_an_input_longer_than_the_token_cap_runs_alone():
    plan = FixedWindow(0.010).plan([pend(0, 1.0, tokens=500), pend(1, 1.0)], 1.0, EST, LIMITS, 0.0)
    assert plan.launch == (0,)


def test_wmax_is_the_target_less_compute_less_margin_within_floor_and_ceiling():
    policy = DeadlineAware(target_s=0.050, margin_s=0.002)
    assert math.isclose(policy.max_wait(2, 20, EST), 0.050 - 0.007 - 0.002)
    assert DeadlineAware(0.050, 0.002, max_wait_s=0.010).max_wait(2, 20, EST) == 0.010
    assert DeadlineAware(0.005, 0.002, min_wait_s=0.001).max_wait(2, 20, EST) == 0.001


def test_deadline_aware_waits_for_company_while_batches_this_small_cannot_keep_up():
    policy = DeadlineAware(target_s=0.050, margin_s=0.002)
    plan = policy.plan([pend(0, 1.000)], 1.001, EST, LIMITS, arrival_rate=1000.0)   # one per 6 ms < 1000/s
    assert plan.launch == ()
    assert math.isclose(plan.wake_at, 1.000 + 0.050 - 0.006 - 0.002)    # oldest + Wmax(1 request, 10 tokens)


def test_deadline_aware_launches_at_once_when_batches_this_size_keep_up_with_arrivals():
    policy = DeadlineAware(target_s=0.050, margin_s=0.002)
    assert policy.plan([pend(0, 1.000)], 1.001, EST, LIMITS, arrival_rate=100.0).launch == (0,)
    two = [pend(0, 1.000), pend(1, 1.001)]
    assert policy.plan(two, 1.001, EST, LIMITS, arrival_rate=250.0).launch == (0, 1)    # 2 per 7 ms > 250/s


def test_deadline_aware_closes_when_the_oldest_has_waited_wmax():
    policy = DeadlineAware(target_s=0.050, margin_s=0.002)
    pending = [pend(0, 1.000), pend(1, 1.030)]
    assert policy.plan(pending, 1.041, EST, LIMITS, arrival_rate=1e6).launch == (0, 1)  # Wmax(2, 20) = 41 ms


def test_deadline_aware_closes_early_when_waiting_would_miss_a_members_deadline():
    policy = DeadlineAware(target_s=1.0, margin_s=0.001)          # a loose target: only the deadline binds
    pending = [pend(0, 1.000), pend(1, 1.000, deadline=1.020)]
    plan = policy.plan(pending, 1.000, EST, LIMITS, arrival_rate=1e6)
    assert plan.launch == () and math.isclose(plan.wake_at, 1.020 - 0.001 - 0.007)   # latest start that meets it
    assert policy.plan(pending, plan.wake_at, EST, LIMITS, arrival_rate=1e6).launch == (0, 1)


def test_deadline_aware_drops_a_request_that_cannot_meet_its_deadline_and_margin_even_alone():
    policy = DeadlineAware(target_s=0.050, margin_s=0.002)
    pending = [pend(0, 1.000, deadline=1.0075), pend(1, 1.000, deadline=1.100)]   # 6 ms alone: inside the margin
    plan = policy.plan(pending, 1.000, EST, LIMITS, arrival_rate=0.0)
    assert plan.drop == (0,) and plan.launch == (1,)


def test_deadline_aware_stops_growing_a_batch_its_first_member_could_not_afford():
    policy = DeadlineAware(target_s=1.0, margin_s=0.0)
    # The head is due in 12 ms: 5 ms + 0.1 ms/token fits 70 tokens, so the third 30-token input waits.
    pending = [pend(0, 1.0, tokens=30, deadline=1.012), pend(1, 1.0, tokens=30), pend(2, 1.0, tokens=30)]
    plan = policy.plan(pending, 1.0, EST, LIMITS, arrival_rate=1e6)
    assert plan.launch == (0, 1) and plan.drop == ()


def test_deadline_aware_skips_an_urgent_request_when_that_serves_more_on_time():
    policy = DeadlineAware(target_s=1.0, margin_s=0.0)
    # The head can be served alone or with one more (7 ms); skipping it lets seven go together.
    pending = [pend(0, 1.0, deadline=1.007)] + [pend(i, 1.0) for i in range(1, 8)]
    plan = policy.plan(pending, 1.0, EST, Limits(max_requests=8, max_tokens=1000), arrival_rate=1e6)
    assert plan.launch == tuple(range(1, 8)) and plan.drop == ()


def test_a_request_already_late_for_its_target_rides_along_without_holding_the_batch_back():
    policy = DeadlineAware(target_s=0.050, margin_s=0.002)
    pending = [pend(0, 0.900)] + [pend(i, 1.0) for i in range(1, 4)]     # the first missed its target long ago
    plan = policy.plan(pending, 1.0, EST, LIMITS, arrival_rate=1e6)
    assert plan.launch == (0, 1, 2, 3) and plan.drop == ()


def test_a_long_input_cut_by_the_size_caps_is_not_skipped_for_ever():
    policy = DeadlineAware(target_s=10.0, margin_s=0.0)
    pending = [pend(0, 1.0, tokens=90)] + [pend(i, 1.0, tokens=20) for i in range(1, 5)]
    assert policy.plan(pending, 1.0, EST, LIMITS, arrival_rate=1e6).launch == (0,)
